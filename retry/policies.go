package retry

import "time"

// The provider's named policies, one per loop, all of them here. Each is
// bounded twice: no wait exceeds its Max, and the loop ends by an attempt
// cap (Attempts) or by the deadline of the context its caller gives it
// (the bound named in the comment). Long-lived loops (Reconnect,
// Takeover, EtcdRead in Observe) run for as long as their owner wants the
// thing they wait for; their bound is that owner's context.
var (
	// Step paces the executor's retries of a step that failed with a
	// retryable error class. Bound: the transition's deadline (or
	// --repair-attempts for a drift repair).
	Step = Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
	// Poll paces polling a hypervisor task, a guest process or a domain
	// shutting down until it ends (progress checks, not retries of a
	// failed request). Bound: the caller's deadline.
	Poll = Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
	// Reconnect paces redialling a lost hypervisor connection: quick at
	// first, never more than a few seconds apart, so a host that comes
	// back is used again soon. Bound: the connection's lifetime; Reset
	// after a dial succeeds.
	Reconnect = Policy{Initial: 200 * time.Millisecond, Max: 2 * time.Second}
	// Takeover paces a high-availability replica that cannot lead: its
	// campaign failed, or it was elected but could not open the state (a
	// damaged record, etcd refusing reads) and resigned. The wait doubles
	// up to half a minute, so a replica that cannot open the state stops
	// re-electing itself several times a second and leaves the election
	// to the others; it is Reset only once a term opened. Bound: the
	// replica's lifetime.
	Takeover = Policy{Initial: 500 * time.Millisecond, Max: 30 * time.Second}

	// EtcdTxn paces re-sending an etcd transaction that failed with
	// Unavailable or outlived its attempt timeout. Bound:
	// etcdstore.Options.TxnTimeout and the leadership term (Before).
	EtcdTxn = Policy{Initial: 25 * time.Millisecond, Max: 500 * time.Millisecond}
	// EtcdConnect paces asking the etcd endpoints for their status until
	// one answers. Bound: the dial timeout.
	EtcdConnect = Policy{Initial: 100 * time.Millisecond, Max: time.Second}
	// EtcdRead paces re-reading the election key after a failed read
	// (Elector.Observe, a term re-checking its key after a broken watch);
	// Reset after a read succeeds. Bound: the observer's context, the
	// term's lease clock.
	EtcdRead = Policy{Initial: 200 * time.Millisecond, Max: time.Second}
	// EtcdCompacted re-reads a consistent cut of the state whose revision
	// etcd compacted while it was being read. Bound: 3 attempts.
	EtcdCompacted = Policy{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Attempts: 3}

	// StateRead re-reads a state file whose files were replaced while it
	// was read (a compaction), or whose tail looked torn (a writer's Open
	// truncates it). Bound: 50 attempts (about 2 s).
	StateRead = Policy{Initial: time.Millisecond, Max: 50 * time.Millisecond, Attempts: 50}
	// Relock locks a state's journals again when a writer replaced one
	// between open and lock. Bound: 10 attempts.
	Relock = Policy{Initial: time.Millisecond, Max: 10 * time.Millisecond, Attempts: 10}
	// VMIDCollision allocates another VMID when the one a Proxmox clone
	// asked for was taken meanwhile. Its classifier is ErrExists only,
	// disjoint from the executor's (Step), so the attempts never multiply.
	// Bound: 64 attempts.
	VMIDCollision = Policy{Initial: time.Millisecond, Max: 20 * time.Millisecond, Attempts: 64}
)

// Named lists every policy above by its name, for the docs and for the
// test that each is bounded.
func Named() map[string]Policy {
	return map[string]Policy{
		"Step": Step, "Poll": Poll, "Reconnect": Reconnect, "Takeover": Takeover,
		"EtcdTxn": EtcdTxn, "EtcdConnect": EtcdConnect, "EtcdRead": EtcdRead, "EtcdCompacted": EtcdCompacted,
		"StateRead": StateRead, "Relock": Relock, "VMIDCollision": VMIDCollision,
	}
}
