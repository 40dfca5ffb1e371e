// Package relay is a TCP relay for tests: it forwards connections from a
// loopback port to a target address and lets a test cut the path (close
// the listener and every connection, as a stopped listener or a reset
// network does) or freeze it (keep connections open but forward nothing,
// as a silent network partition does), and restore it.
//
// Invariants: it listens on 127.0.0.1 only and forwards only to the target
// it was given; Close releases every goroutine and connection it made.
package relay
