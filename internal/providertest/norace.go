//go:build !race

package providertest

// RaceEnabled is true when the tests run with -race: the provider binary
// they start is then built with -race too.
const RaceEnabled = false
