// Package kv holds the one operation every state store applies: a put of
// a value under a key, or a delete. The desired document speaks it
// (desired.Op), and the local journal (statefile) and the etcd store
// (etcdstore) take it as it is, so a change goes from the document to
// disk or to etcd without being copied into another type on the way.
package kv

// Op is one change: a put of Value under Key, or a delete of Key.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
}
