package proxmox

import (
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
)

// cacheSizes are the adapter's per-VM maps.
func (a *Adapter) cacheSizes() (configs, dirty, owners int) {
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	return len(a.configs), len(a.dirty), len(a.owners)
}

// TestCachesStayFlat runs many create/delete cycles, observing the node
// in between as the reconciler does, and checks that the adapter's
// per-VM caches stay flat (issue 18: dirty gained an entry on every VM
// delete and was never pruned).
func TestCachesStayFlat(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t, 2*time.Minute)
	const cycles = 60
	var peak [3]int
	for i := range cycles {
		m := "m-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		spec := cloneSpec(m)
		id, err := e.a.CloneVM(ctx, "pve2", spec)
		if err != nil {
			t.Fatalf("cycle %d: CloneVM: %v", i, err)
		}
		tg := hypervisors.Target{Zone: "pve2", VMID: id, Name: spec.Name}
		if err := e.a.ConfigureVM(ctx, tg, pvespec.SizeSpec{VCPU: 2, MemoryMiB: 2048, Marker: marker(m)}); err != nil {
			t.Fatalf("cycle %d: ConfigureVM: %v", i, err)
		}
		if _, err := e.a.Observe(ctx, "pve2"); err != nil {
			t.Fatalf("cycle %d: Observe: %v", i, err)
		}
		if err := e.a.DeleteVM(ctx, tg); err != nil {
			t.Fatalf("cycle %d: DeleteVM: %v", i, err)
		}
		if _, err := e.a.Observe(ctx, "pve2"); err != nil {
			t.Fatalf("cycle %d: Observe: %v", i, err)
		}
		c, d, o := e.a.cacheSizes()
		peak = [3]int{max(peak[0], c), max(peak[1], d), max(peak[2], o)}
	}
	// Nothing is left once the last VM is gone and observed; nothing
	// grew with the cycles.
	if c, d, o := e.a.cacheSizes(); c+d+o != 0 || peak[0] > 1 || peak[1] > 1 || peak[2] > 1 {
		t.Errorf("after %d create/delete cycles: configs %d, dirty %d, owners %d (peaks %v); want 0 now and at most 1 at any time", cycles, c, d, o, peak)
	}
}
