package server

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// Sampling of rejected-RPC log lines (docs/operations.md): per method and
// code, the first rejectLogBurst rejections of each rejectLogWindow are
// logged one by one, then one line per window says how many more there
// were. bigfleet_provider_rpc_rejected_total counts every one.
const (
	rejectLogWindow = 10 * time.Second
	rejectLogBurst  = 5
)

type rejectKey struct{ method, code string }

// rejectLog decides which rejections are logged. The zero value is
// ready; its memory is one counter per (method, code) seen in the current
// window, and both come from closed sets (registered methods, gRPC
// codes).
type rejectLog struct {
	now func() time.Time // nil: time.Now (tests set a clock)

	mu    sync.Mutex
	start time.Time // of the current window
	seen  map[rejectKey]int
}

// suppressed is a summary: count rejections of key were not logged in
// the window that ended.
type suppressed struct {
	key   rejectKey
	count int
}

// clock is the time now.
func (r *rejectLog) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

// admit counts a rejection and reports whether to log it, with the
// summaries of the window that ended before it, if one did.
func (r *rejectLog) admit(k rejectKey) (bool, []suppressed) {
	now := r.clock()
	r.mu.Lock()
	defer r.mu.Unlock()
	ended := r.rollLocked(now)
	if r.seen == nil {
		r.seen = map[rejectKey]int{}
		r.start = now
	}
	r.seen[k]++
	return r.seen[k] <= rejectLogBurst, ended
}

// roll ends the current window if it is over and returns its summaries.
func (r *rejectLog) roll(now time.Time) []suppressed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rollLocked(now)
}

func (r *rejectLog) rollLocked(now time.Time) []suppressed {
	if r.seen == nil || now.Sub(r.start) < rejectLogWindow {
		return nil
	}
	var out []suppressed
	for k, n := range r.seen {
		if n > rejectLogBurst {
			out = append(out, suppressed{k, n - rejectLogBurst})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].key.method != out[j].key.method {
			return out[i].key.method < out[j].key.method
		}
		return out[i].key.code < out[j].key.code
	})
	r.seen = nil
	return out
}

// logSuppressed writes one line per summary.
func logSuppressed(ctx context.Context, log *slog.Logger, sums []suppressed) {
	for _, s := range sums {
		log.WarnContext(ctx, "rpc rejections not logged", "method", s.key.method, "code", s.key.code, "count", s.count,
			"window", rejectLogWindow.String())
	}
}

// flushRejects writes the summary of each window once it is over, also
// when no rejection follows it, until ctx ends.
func (p *Provider) flushRejects(ctx context.Context) {
	t := time.NewTicker(rejectLogWindow)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			logSuppressed(context.Background(), p.log, p.rejects.roll(p.rejects.clock().Add(rejectLogWindow)))
			return
		case <-t.C:
			logSuppressed(ctx, p.log, p.rejects.roll(p.rejects.clock()))
		}
	}
}
