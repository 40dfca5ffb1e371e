package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy is a capped, jittered exponential schedule with an optional
// attempt cap. The zero value of a field takes its default.
type Policy struct {
	// Initial is the first wait before jitter (default 100 ms).
	Initial time.Duration
	// Max caps every wait, jitter included (default 2 s).
	Max time.Duration
	// Multiplier grows the wait after each attempt (default 2).
	Multiplier float64
	// Jitter spreads each wait uniformly over ±Jitter of it (default 0.5;
	// NoJitter turns it off).
	Jitter float64
	// NoJitter makes the waits deterministic (tests of the schedule).
	NoJitter bool
	// Attempts caps the number of attempts (0: until the context ends).
	Attempts int
	// Before, when set, is asked right before every attempt, the first
	// included; a non-nil answer ends the loop at once with that error
	// (never retried, never shown to the classifier). The executor asks
	// whether its leadership term still holds.
	Before func() error
}

func (p Policy) withDefaults() Policy {
	if p.Initial <= 0 {
		p.Initial = 100 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 2 * time.Second
	}
	if p.Max < p.Initial {
		p.Max = p.Initial
	}
	if p.Multiplier < 1 {
		p.Multiplier = 2
	}
	if p.Jitter <= 0 || p.Jitter > 1 {
		p.Jitter = 0.5
	}
	if p.NoJitter {
		p.Jitter = 0
	}
	return p
}

// Backoff is the wait schedule of one loop.
type Backoff struct {
	max time.Duration
	b   *backoff.ExponentialBackOff
}

// Backoff returns a fresh schedule following p.
func (p Policy) Backoff() *Backoff {
	p = p.withDefaults()
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		RandomizationFactor: p.Jitter,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.Max,
	}
	b.Reset()
	return &Backoff{max: p.Max, b: b}
}

// Next returns the next wait (never more than Policy.Max).
func (b *Backoff) Next() time.Duration { return min(b.b.NextBackOff(), b.max) }

// Reset starts the schedule over at Policy.Initial.
func (b *Backoff) Reset() { b.b.Reset() }

// Sleep waits d or until ctx is done; it returns ctx's error in the
// latter case.
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Do calls op until it returns nil, returns an error retryable rejects,
// the attempts are spent, or ctx is done. The error returned is op's last
// error, or, when ctx ended first, one matching ctx.Err() that names op's
// last error that said more than that the context ended (an attempt cut
// short by the deadline reports only the deadline; the failure that made
// the loop retry until then is the one an operator needs).
func Do(ctx context.Context, p Policy, retryable func(error) bool, op func(context.Context) error) error {
	_, err := Value(ctx, p, retryable, func(ctx context.Context) (struct{}, error) { return struct{}{}, op(ctx) })
	return err
}

// Value is Do for an operation that returns a value: the value of the
// successful attempt (or of the last one).
func Value[T any](ctx context.Context, p Policy, retryable func(error) bool, op func(context.Context) (T, error)) (T, error) {
	var b *Backoff // made at the first retry: most calls succeed at once
	attempts := p.withDefaults().Attempts
	var cause error // the last failure that was not only ctx ending
	for n := 1; ; n++ {
		if p.Before != nil {
			if err := p.Before(); err != nil {
				var zero T
				return zero, err
			}
		}
		v, err := op(ctx)
		if err == nil {
			return v, nil
		}
		if retryable == nil || !retryable(err) || (attempts > 0 && n >= attempts) {
			return v, err
		}
		if cause == nil || ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
			cause = err
		}
		if b == nil {
			b = p.Backoff()
		}
		if serr := Sleep(ctx, b.Next()); serr != nil {
			return v, &interrupted{ctx: serr, last: cause}
		}
	}
}

// interrupted is a retry loop ended by its context: it matches the
// context's error and names the last failure (without wrapping it, so
// the failure's class does not make the interruption look retryable).
type interrupted struct {
	ctx  error
	last error
}

func (e *interrupted) Error() string { return fmt.Sprintf("%v (last error: %v)", e.ctx, e.last) }
func (e *interrupted) Unwrap() error { return e.ctx }

// Last returns the last telling error of a loop its context ended (the
// last attempt's, unless that one only says the context ended), or nil.
func Last(err error) error {
	var i *interrupted
	if errors.As(err, &i) {
		return i.last
	}
	return nil
}
