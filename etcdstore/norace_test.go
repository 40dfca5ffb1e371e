//go:build !race

package etcdstore

const raceEnabled = false
