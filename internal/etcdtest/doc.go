// Package etcdtest runs real etcd clusters for tests, by default inside
// the test process, built with go.etcd.io/etcd/server/v3/embed: N members
// (3 by default) on loopback ports outside the ephemeral range (package
// freeport) with data in the test's temporary directory,
// optionally serving clients over TLS with client-certificate auth from a
// freshly generated CA.
//
// With ETCDTEST_BINARY naming an etcd binary (Debian's etcd-server ships
// 3.4 as /usr/bin/etcd), every member runs instead as a child process of
// that binary with the same settings given as flags, so a suite can be
// run against an etcd release other than the one this module embeds.
// Each process has its own process group and dies with the test binary
// (Pdeathsig); Kill is SIGKILL, Stop is SIGTERM, and Close kills every
// member and waits for it.
//
// Invariants tests may rely on:
//   - Start (and New) return only when every member is ready and the
//     cluster has a raft leader. A member that loses its port to another
//     process between the pick and its bind costs a new cluster on new
//     ports (at most bootTries), not the test.
//   - Start registers a cleanup, and New's caller (a TestMain sharing one
//     cluster) calls Close, which stops every member, closes every client
//     the cluster handed out and removes the data, so nothing outlives the
//     test.
//   - A stopped member keeps its data directory and ports: Restart brings
//     it back as the same member, so stopping two of three loses quorum
//     and restarting one restores it.
//   - Members compact their history themselves (periodic auto-compaction,
//     CompactionRetention), the way production clusters must be set up.
package etcdtest
