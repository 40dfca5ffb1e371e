package desired

import (
	"context"
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkFleetFootprint100k walks 100,000 machines through a Create
// (with the steps a libvirt Create records) on a memory store and reports
// the heap held and the bytes the store holds afterwards. Run it here and
// on a commit before histories (with recordSteps a no-op) for the ratio.
func BenchmarkFleetFootprint100k(b *testing.B) {
	const n = 100000
	for range b.N {
		store := NewMemoryStore(nil)
		d := open(b, store, slots(n))
		ctx := context.Background()
		for i := range n {
			id := fmt.Sprintf("z1/kvm.small/%03d", i)
			a, err := d.Mutate(ctx, Request{Kind: KindCreate, MachineID: id})
			if err != nil {
				b.Fatal(err)
			}
			recordSteps(d, id, a.OpID)
			if _, err := d.Complete(ctx, id, a.OpID, Result{Host: "z1/" + id}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(store.Size())/(1<<20), "state-MiB")
		runtime.KeepAlive(d)
	}
}
