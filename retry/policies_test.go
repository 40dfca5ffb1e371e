package retry

import (
	"context"
	"errors"
	"testing"
)

// ctxBounded are the policies without an attempt cap: their loops end
// with the context their caller gives them (see policies.go). A new
// policy must either cap its attempts or be added here with its bound
// documented.
var ctxBounded = map[string]bool{
	"Step": true, "Poll": true, "Reconnect": true, "Takeover": true,
	"EtcdTxn": true, "EtcdConnect": true, "EtcdRead": true,
}

func TestNamedPoliciesAreBounded(t *testing.T) {
	for name, p := range Named() {
		t.Run(name, func(t *testing.T) {
			if p.Initial <= 0 || p.Max <= 0 || p.Max < p.Initial {
				t.Errorf("%s = %+v: Initial and Max must be set, Max >= Initial", name, p)
			}
			if p.Attempts == 0 && !ctxBounded[name] {
				t.Errorf("%s has no attempt cap and is not listed as bounded by its caller's context", name)
			}
			if p.Attempts > 0 && ctxBounded[name] {
				t.Errorf("%s caps its attempts; drop it from ctxBounded", name)
			}
			b := p.Backoff()
			for range 100 {
				if d := b.Next(); d > p.Max || d <= 0 {
					t.Fatalf("%s waits %v, want (0, %v]", name, d, p.Max)
				}
			}
			if p.Attempts > 0 {
				fast := p
				fast.Initial, fast.Max = 1, 1
				n := 0
				err := Do(context.Background(), fast, func(error) bool { return true }, func(context.Context) error {
					n++
					return errors.New("again")
				})
				if err == nil || n != p.Attempts {
					t.Errorf("%s made %d attempts (err %v), want %d", name, n, err, p.Attempts)
				}
			}
		})
	}
	for name := range ctxBounded {
		if _, ok := Named()[name]; !ok {
			t.Errorf("ctxBounded lists %s, which is not a named policy", name)
		}
	}
}
