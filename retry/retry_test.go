package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var (
	errAgain = errors.New("again")
	errFinal = errors.New("final")
)

func isAgain(err error) bool { return errors.Is(err, errAgain) }

// fast is a policy whose waits are too short to matter.
var fast = Policy{Initial: time.Microsecond, Max: 10 * time.Microsecond}

func TestDo(t *testing.T) {
	tests := []struct {
		name      string
		policy    Policy
		retryable func(error) bool
		results   []error // op's result per attempt; the last repeats
		wantCalls int
		wantErr   error
	}{
		{name: "first attempt succeeds", policy: fast, retryable: isAgain, results: []error{nil}, wantCalls: 1},
		{name: "retryable until success", policy: fast, retryable: isAgain, results: []error{errAgain, errAgain, nil}, wantCalls: 3},
		{name: "terminal error is not retried", policy: fast, retryable: isAgain, results: []error{errFinal}, wantCalls: 1, wantErr: errFinal},
		{name: "terminal after retries", policy: fast, retryable: isAgain, results: []error{errAgain, errFinal}, wantCalls: 2, wantErr: errFinal},
		{name: "nil classifier retries nothing", policy: fast, results: []error{errAgain}, wantCalls: 1, wantErr: errAgain},
		{name: "attempt cap", policy: Policy{Initial: time.Microsecond, Max: time.Microsecond, Attempts: 4}, retryable: isAgain,
			results: []error{errAgain}, wantCalls: 4, wantErr: errAgain},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := Do(context.Background(), tc.policy, tc.retryable, func(context.Context) error {
				r := tc.results[min(calls, len(tc.results)-1)]
				calls++
				return r
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if calls != tc.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tc.wantCalls)
			}
		})
	}
}

// TestBeforeEveryAttempt: Before is asked before each attempt, and the
// first refusal ends the loop without another attempt, even while the
// last failure was retryable.
func TestBeforeEveryAttempt(t *testing.T) {
	errDeposed := errors.New("deposed")
	tests := []struct {
		name       string
		allow      int // Before answers nil this many times, then errDeposed
		wantCalls  int
		wantBefore int
		wantErr    error
	}{
		{name: "refused before the first attempt", allow: 0, wantCalls: 0, wantBefore: 1, wantErr: errDeposed},
		{name: "refused between attempts", allow: 2, wantCalls: 2, wantBefore: 3, wantErr: errDeposed},
		{name: "never refused", allow: 100, wantCalls: 5, wantBefore: 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			asked, calls := 0, 0
			p := fast
			p.Before = func() error {
				asked++
				if asked > tc.allow {
					return errDeposed
				}
				return nil
			}
			err := Do(context.Background(), p, isAgain, func(context.Context) error {
				if calls++; calls < 5 {
					return errAgain
				}
				return nil
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff([2]int{tc.wantCalls, tc.wantBefore}, [2]int{calls, asked}); diff != "" {
				t.Errorf("[attempts, Before calls] (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValue(t *testing.T) {
	calls := 0
	v, err := Value(context.Background(), fast, isAgain, func(context.Context) (int, error) {
		calls++
		if calls < 3 {
			return 0, errAgain
		}
		return 42, nil
	})
	if err != nil || v != 42 || calls != 3 {
		t.Errorf("Value = %d, %v after %d calls; want 42, nil after 3", v, err, calls)
	}
}

// A loop its context ends reports the context's error and names the last
// failure without wrapping it, so the failure's class cannot make the
// interruption look retryable.
func TestDoEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Do(ctx, Policy{Initial: time.Hour, Max: time.Hour}, isAgain, func(context.Context) error {
		calls++
		cancel() // the wait that follows must end at once
		return errAgain
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if errors.Is(err, errAgain) {
		t.Errorf("err %v wraps the last failure", err)
	}
	if got := Last(err); got != errAgain {
		t.Errorf("Last = %v, want %v", got, errAgain)
	}
	if calls != 1 {
		t.Errorf("calls = %d, want 1", calls)
	}
	if Last(errFinal) != nil {
		t.Error("Last of a plain error is not nil")
	}
}

// TestDeadlineKeepsTheCause is the regression of a Create whose clone
// task always failed but whose last_error named only "wait for a clone
// slot: context deadline exceeded": the attempt the deadline cut short
// hid the failure that made the loop retry until then.
func TestDeadlineKeepsTheCause(t *testing.T) {
	errFull := errors.New("clone failed: storage 'local-lvm' is full")
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Do(ctx, fast, func(error) bool { return true }, func(ctx context.Context) error {
		calls++
		switch calls {
		case 1, 2:
			return errFull
		case 3:
			cancel() // the deadline lands inside this attempt
			return fmt.Errorf("wait for a slot: %w", ctx.Err())
		}
		t.Fatal("an attempt after the context ended")
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if got := Last(err); got != errFull {
		t.Errorf("Last = %v, want the failure before the deadline: %v", got, errFull)
	}

	// With nothing before it, the context error is all there is to say.
	ctx, cancel = context.WithCancel(context.Background())
	err = Do(ctx, fast, func(error) bool { return true }, func(ctx context.Context) error {
		cancel()
		return fmt.Errorf("wait for a slot: %w", ctx.Err())
	})
	if got := Last(err); got == nil || !errors.Is(got, context.Canceled) {
		t.Errorf("Last = %v, want the only attempt's error", got)
	}
}

func TestBackoffScheduleWithoutJitter(t *testing.T) {
	b := Policy{Initial: 100 * time.Millisecond, Max: time.Second, NoJitter: true}.Backoff()
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("schedule (-want +got):\n%s", diff)
	}
	b.Reset()
	if got := b.Next(); got != 100*time.Millisecond {
		t.Errorf("after Reset: %s, want 100ms", got)
	}
}

// Jitter spreads waits but never past the cap, and not below half the
// interval (the default ±50 %).
func TestBackoffJitterIsCapped(t *testing.T) {
	for _, p := range []Policy{Step, Poll, Reconnect} {
		b := p.Backoff()
		interval := p.Initial
		spread := false
		for i := range 200 {
			d := b.Next()
			if d > p.Max {
				t.Fatalf("%+v: wait %d = %s exceeds the cap", p, i, d)
			}
			if d < interval/2 {
				t.Fatalf("%+v: wait %d = %s below half of %s", p, i, d, interval)
			}
			spread = spread || d != interval
			interval = min(interval*2, p.Max)
		}
		if !spread {
			t.Errorf("%+v: no jitter in 200 waits", p)
		}
	}
}

func TestSleep(t *testing.T) {
	if err := Sleep(context.Background(), time.Microsecond); err != nil {
		t.Errorf("Sleep = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep on a done context = %v", err)
	}
}
