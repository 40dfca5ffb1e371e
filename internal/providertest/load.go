package providertest

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// CreateAll sends an unfenced Create for every id in targets from one
// worker per client, each taking the next id until none is left, and
// returns how long that took and each acknowledged Create's latency (one
// per target at most, so the slice is bounded by len(targets)). Each call
// is bounded by a minute. An error is reported on tb and stops its
// worker. The benchmarks of durable mutations use it, on one store or
// another, and with one client it is a serial walk.
func CreateAll(tb testing.TB, clients []pb.CapacityProviderClient, targets []string) (time.Duration, []time.Duration) {
	var next atomic.Int64
	var mu sync.Mutex
	lat := make([]time.Duration, 0, len(targets))
	var wg sync.WaitGroup
	t0 := time.Now()
	for _, c := range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(targets) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				start := time.Now()
				_, err := c.Create(ctx, &pb.CreateRequest{MachineId: targets[i]})
				d := time.Since(start)
				cancel()
				if err != nil {
					tb.Errorf("create %s: %v", targets[i], err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return time.Since(t0), lat
}

// Percentile is the p-th percentile (0 to 1, by index into the sorted
// copy) of d; 0 for none.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}
