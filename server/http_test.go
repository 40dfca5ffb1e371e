package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/jsonplan"
)

// blockingPlanner counts computations and holds each until released.
type blockingPlanner struct {
	calls   atomic.Int32
	started chan struct{}
	release chan struct{}
}

func (b *blockingPlanner) plan(ctx context.Context) (*jsonplan.Plan, error) {
	b.calls.Add(1)
	b.started <- struct{}{}
	<-b.release
	return &jsonplan.Plan{Installation: "i"}, nil
}

// TestPlanCacheCoalesces sends 20 requests while a computation runs and
// checks they share it: one observation of the world, not twenty.
func TestPlanCacheCoalesces(t *testing.T) {
	b := &blockingPlanner{started: make(chan struct{}, 100), release: make(chan struct{})}
	c := newPlanCache(context.Background(), b.plan)
	var wg sync.WaitGroup
	bodies := make([][]byte, 20)
	wg.Add(1)
	go func() {
		defer wg.Done()
		bodies[0], _, _ = c.get(context.Background(), 0)
	}()
	<-b.started
	// The late requests accept a stored plan, so one that only arrives
	// after the computation (a slow goroutine) cannot start another; one
	// that arrives during it must join it rather than compute its own.
	for i := 1; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bodies[i], _, _ = c.get(context.Background(), time.Hour)
		}()
	}
	time.Sleep(50 * time.Millisecond) // let them reach get
	close(b.release)
	wg.Wait()
	if n := b.calls.Load(); n != 1 {
		t.Errorf("%d computations for 20 concurrent requests, want 1", n)
	}
	for i, body := range bodies {
		if len(body) == 0 {
			t.Errorf("request %d got no plan", i)
		}
	}
}

func TestPlanCacheMaxAgeAndInvalidate(t *testing.T) {
	b := &blockingPlanner{started: make(chan struct{}, 100), release: make(chan struct{})}
	close(b.release)
	c := newPlanCache(context.Background(), b.plan)
	ctx := context.Background()
	if _, _, err := c.get(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.get(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := b.calls.Load(); n != 1 {
		t.Errorf("a young plan was computed again: %d computations", n)
	}
	if _, _, err := c.get(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if n := b.calls.Load(); n != 2 {
		t.Errorf("max_age 0 served a stored plan: %d computations", n)
	}
	c.invalidate()
	if _, _, err := c.get(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := b.calls.Load(); n != 3 {
		t.Errorf("an invalidated plan was served: %d computations", n)
	}
}

// TestPlanCacheRequestGivesUp checks a request whose context ends stops
// waiting, while the computation goes on for the others.
func TestPlanCacheRequestGivesUp(t *testing.T) {
	b := &blockingPlanner{started: make(chan struct{}, 100), release: make(chan struct{})}
	c := newPlanCache(context.Background(), b.plan)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, _, err := c.get(ctx, 0); errc <- err }()
	<-b.started
	cancel()
	if err := <-errc; err == nil {
		t.Error("a cancelled request got a plan")
	}
	close(b.release)
	if body, _, err := c.get(context.Background(), time.Hour); err != nil || len(body) == 0 {
		t.Errorf("after the computation: %v", err)
	}
}

// TestDebugPlanMaxAgeFloor: without the admin endpoints a max_age below
// minPlanMaxAge is raised to it, so callers asking for max_age=0 in a loop
// share one observation instead of each forcing one of every host; with
// --fake-admin (the simulator) max_age=0 still observes afresh.
func TestDebugPlanMaxAgeFloor(t *testing.T) {
	// A clock a millisecond further at each reading, whatever the load.
	var ticks atomic.Int64
	at := time.Now()
	planClock = func() time.Time { return at.Add(time.Duration(ticks.Add(1)) * time.Millisecond) }
	defer func() { planClock = time.Now }()
	for _, tc := range []struct {
		name        string
		admin       bool
		wantPlans   int32
		wantApplied string
	}{
		{"admin off: raised to the floor", false, 1, minPlanMaxAge.String()},
		{"admin on: honoured", true, 3, "0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &blockingPlanner{started: make(chan struct{}, 100), release: make(chan struct{})}
			close(b.release)
			p := &Provider{cfg: &config.Config{Backend: config.BackendFake, Fake: config.Fake{Admin: tc.admin}},
				plans: newPlanCache(context.Background(), b.plan)}
			for range 3 {
				rec := httptest.NewRecorder()
				p.debugPlan(rec, httptest.NewRequest(http.MethodGet, "/debug/plan?max_age=0", nil))
				if rec.Code != http.StatusOK {
					t.Fatalf("GET /debug/plan?max_age=0: %d %s", rec.Code, rec.Body)
				}
				if got := rec.Header().Get("X-Plan-Max-Age"); got != tc.wantApplied {
					t.Errorf("X-Plan-Max-Age %q, want %q", got, tc.wantApplied)
				}
			}
			// Three requests milliseconds apart: one observation when
			// raised, three when not.
			if n := b.calls.Load(); n != tc.wantPlans {
				t.Errorf("%d observations for 3 requests with max_age=0, want %d", n, tc.wantPlans)
			}
		})
	}
}
