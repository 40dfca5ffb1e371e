// Package freeport hands out loopback TCP addresses for a child process
// (an etcd member, a provider, Prometheus) to listen on a moment later.
//
// Invariants callers may rely on:
//   - Every port lies outside the kernel's ephemeral range
//     (/proc/sys/net/ipv4/ip_local_port_range). Picking with port 0 hands
//     out an ephemeral port, and after the picker closes it the kernel is
//     free to give the same port to any outgoing connection as its source
//     port: an etcd member dialling its peers at start-up took a port its
//     neighbour was about to listen on ("bind: address already in use").
//     No outgoing connection takes a port outside that range.
//   - Every port was bound a moment ago, and the n ports of one call are
//     distinct (their listeners are open together).
//   - The search is bounded (maxTries binds per call); a machine with no
//     free port left gets an error, not a hang.
//
// Tests take their addresses through providertest.FreeAddr and FreeAddrs;
// etcdtest, which is no test, calls Addrs.
//
// Two test processes can still pick the same port at once; the window is
// the time between the picker's close and the child's bind, and a caller
// that starts a child may retry with new ports (etcdtest does).
package freeport
