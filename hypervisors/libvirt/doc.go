// Package libvirt implements hypervisors.Hypervisor and
// lvspec.Steps (the libvirt vocabulary, through Apply) on libvirt hosts through the
// pure-Go go-libvirt client: one connection per zone, dialled through
// go-libvirt's own URI support (qemu:///system, qemu+libssh://,
// qemu+ssh://, qemu+tls://, test:///default via the daemon).
//
// Invariants callers may rely on:
//   - New never dials: connections are made and re-made in the background
//     with backoff, so an unreachable host never blocks startup or another
//     zone. Calls on a zone that is not connected fail at once with an error
//     wrapping hypervisors.ErrUnreachable.
//   - Every libvirt RPC has a deadline (Config.CallTimeout, or the
//     context's if earlier; a guest-agent command adds its agent wait, a
//     seed upload has UploadTimeout) and at most MaxInFlight run at once
//     per connection. A call that outlives its deadline returns a retryable
//     error at once and has the connection probed; a connection whose
//     probe goes unanswered for DeadAfter (or on which every request slot
//     is held by calls unanswered for LostAfter) is closed, every call
//     in flight on it returns ErrUnreachable, and it is redialled. Dialling
//     is bounded at every step (transport, TLS or SSH handshake, libvirt's
//     handshake), and closing a connection closes all of its transport.
//   - Observation reads metadata only, never volume bytes: a seed's identity
//     is the name of its identity tag volume (seedTag). go-libvirt
//     mishandles a download whose data libvirtd sends before the reply (it
//     loses the data and can deadlock the connection:
//     TestGoLibvirtStreamDataBeforeReply), so the adapter downloads
//     nothing; the seed upload is the only stream, aborted cleanly at its
//     deadline.
//   - Ownership lives in a metadata element in the namespace Namespace,
//     written to both the live and the persistent definition. Nothing is
//     stopped, undefined or adopted unless that element names this
//     installation (and, for adoption, the machine id); DeleteVolume only
//     touches volumes named with lvspec.VolumePrefix.
//   - Observe costs O(1 + changed domains) libvirt calls: one stats listing,
//     one autostart listing and one volume listing per tick, plus one XML read
//     per domain that is new, changed state or id, was mutated through this
//     adapter, or whose cached read is older than Config.RefreshEvery (and
//     one per volume the first time it is seen, and per seed rewritten).
//   - Errors are wrapped with what was being done and map onto the
//     hypervisors error classes; the bootstrap blob written with
//     AgentWriteFile never appears in an error or log line.
//   - The guest agent is reached through package guest's protocol over
//     libvirt's QGA passthrough (agent.go is the transport only): AgentExec
//     sends guest-exec once and polls guest-exec-status (retry.Poll) until
//     exit or ctx; it returns a retryable class only when the command
//     certainly never reached the agent, and ErrOutcomeUnknown when it may
//     have run. No failed request is retried here: the executor retries
//     steps by class.
package libvirt
