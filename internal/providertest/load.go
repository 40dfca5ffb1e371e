package providertest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// CreateAll sends an unfenced Create for every id in targets from one
// worker per client, each taking the next id until none is left, and
// returns how long that took. An error is reported on tb and stops its
// worker. The benchmarks of durable mutations use it, on one store or
// another.
func CreateAll(tb testing.TB, clients []pb.CapacityProviderClient, targets []string) time.Duration {
	var next atomic.Int64
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
				_, err := c.Create(ctx, &pb.CreateRequest{MachineId: targets[i]})
				cancel()
				if err != nil {
					tb.Errorf("create %s: %v", targets[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0)
}
