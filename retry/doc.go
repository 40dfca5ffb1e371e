// Package retry is where every retry and poll loop of the provider gets
// its schedule: how long to wait between attempts (exponential,
// jittered, capped), which attempts are made again (the caller's
// classifier says), and when to stop (the context, or an attempt cap).
// The schedule is github.com/cenkalti/backoff/v5's exponential backoff
// with a hard cap.
//
// Each loop has its own named policy, and every policy is listed in
// policies.go (Named returns them): Step (the executor's step retries),
// Poll (tasks, guest processes, a domain shutting down), Reconnect
// (hypervisor connections), Takeover (an HA replica that cannot lead),
// EtcdTxn (etcdstore's transaction re-sends), EtcdConnect (the first
// etcd status probe), EtcdRead (Elector.Observe, a term re-reading its
// key), EtcdCompacted (a consistent read overtaken by compaction),
// StateRead (statefile.ReadOnly), Relock (statefile's journal locks) and
// VMIDCollision (a Proxmox clone whose VMID was taken). A loop with its
// own time.Sleep or time.After schedule is a defect: add a policy here.
//
// Invariants:
//   - Every named policy is bounded twice: no wait exceeds its Max, and
//     its loop ends after Attempts or with the deadline of its caller's
//     context (policies.go says which; TestNamedPoliciesAreBounded).
//   - No single wait exceeds Policy.Max, jitter included, and no wait
//     outlives the context: a done context ends Do at once with an error
//     that matches the context's error and names the last failure.
//   - An error the classifier rejects is returned after exactly one
//     attempt; a nil classifier retries nothing.
//   - Do never retries on its own: the classifier decides, so one
//     operation has one retry loop. Callers must not nest Do (an adapter
//     call retried inside an executor retry multiplies attempts); polling
//     a task or process to completion is not a retry and uses Poll or a
//     Backoff.
//   - Policy.Before, when set, is asked before every attempt; once it
//     answers an error no further attempt is made.
//   - A Backoff is a schedule for one loop (not safe for concurrent use);
//     Reset starts it over, e.g. after a reconnect succeeded.
package retry
