package reconciler

import (
	"sort"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/planner"
)

// maxRepairError bounds the error text kept per failing repair.
const maxRepairError = 512

// RepairFailure is a machine whose newest drift repair failed: it waits
// in the work queue with its per-machine backoff. The metrics listener's
// /debug/repairs lists them; the log has one line per failed run.
type RepairFailure struct {
	Machine string `json:"machine"`
	Zone    string `json:"zone"`
	VM      string `json:"vm,omitempty"`
	// Error is the failed run's error (bounded), e.g. the step that ran
	// out of attempts or time and its last error.
	Error string    `json:"error"`
	At    time.Time `json:"at"`
	// Failures counts the runs that failed in a row; RetryIn is the
	// backoff before the next one.
	Failures int      `json:"failures"`
	RetryIn  Duration `json:"retry_in"`
}

// Duration marshals as a Go duration string ("4s").
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// RepairFailures returns the machines whose newest drift repair failed,
// sorted by machine id. It holds at most one entry per machine of the
// document: an entry goes when the repair succeeds, when the machine no
// longer needs one, or when the machine is gone.
func (r *Reconciler) RepairFailures() []RepairFailure {
	r.failMu.Lock()
	out := make([]RepairFailure, 0, len(r.failures))
	for _, f := range r.failures {
		out = append(out, f)
	}
	r.failMu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Machine < out[j].Machine })
	return out
}

// repairFailed records a drift repair that failed (its attempts or its
// RepairTimeout ran out, or a terminal error), logs it and counts it. The
// machine is requeued with backoff by the caller.
func (r *Reconciler) repairFailed(m *desired.Machine, err error) {
	msg := err.Error()
	if len(msg) > maxRepairError {
		msg = strings.ToValidUTF8(msg[:maxRepairError], "") + "..."
	}
	// The queue's per-machine backoff: RetryMin doubled per failure in a
	// row, at most RetryMax (the same schedule the rate limiter follows).
	n := r.queue.NumRequeues(m.ID)
	wait := r.o.RetryMax
	if n < 32 {
		wait = min(r.o.RetryMin<<n, r.o.RetryMax)
	}
	r.failMu.Lock()
	f := r.failures[m.ID]
	f = RepairFailure{Machine: m.ID, Zone: m.Zone, VM: m.VMName, Error: msg, At: r.o.Now(), Failures: f.Failures + 1, RetryIn: Duration(wait)}
	r.failures[m.ID] = f
	r.failMu.Unlock()
	r.o.Logger.Warn("drift repair failed; back to the work queue with backoff", "machine", m.ID, "zone", m.Zone, "vm", m.VMName,
		"err", msg, "failures", f.Failures, "retry_in", wait)
	if r.o.Metrics != nil {
		r.o.Metrics.RepairFailed(m.Zone)
	}
}

// repaired forgets a machine's failed repair and its drift hold once a
// repair (or a run with nothing left to repair) succeeded.
func (r *Reconciler) repaired(id string) {
	r.failMu.Lock()
	delete(r.failures, id)
	r.failMu.Unlock()
	r.driftMu.Lock()
	delete(r.driftSince, id)
	r.driftMu.Unlock()
}

// forget drops what the loop remembers of a machine that is gone.
func (r *Reconciler) forget(id string) {
	r.repaired(id)
	r.totals.machine(id, r.o.Now(), planner.Contribution{})
}

// prune forgets the failed repairs and drift holds of machines that are
// no longer in the document (a full pass calls it).
func (r *Reconciler) prune() {
	gone := func(id string) bool { return r.o.Doc.Get(id) == nil }
	r.failMu.Lock()
	for id := range r.failures {
		if gone(id) {
			delete(r.failures, id)
		}
	}
	r.failMu.Unlock()
	r.driftMu.Lock()
	for id := range r.driftSince {
		if gone(id) {
			delete(r.driftSince, id)
		}
	}
	r.driftMu.Unlock()
}
