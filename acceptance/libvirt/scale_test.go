//go:build integration

package libvirt

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// percentile returns the p-th percentile (nearest rank) of sorted ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*p+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(ds) {
		i = len(ds) - 1
	}
	return ds[i]
}

// Eight Creates at once on one TCG host: Create -> IDLE per machine, p50
// and p95, next to the floor the host allows: eight bare domains (same
// kernel, initrd, memory and agent channel, no volumes) defined, started
// and waited for with virsh alone, also in parallel.
//
// Not parallel: the numbers are about this host's two cores.
func TestParallelCreates8(t *testing.T) {
	const n = 8
	p := startProvider(t, oneZone(n))
	var mu sync.Mutex
	var took []time.Duration
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("a/tiny.1/%03d", i)
		start := p.create(id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := p.c.Get(rpcCtx(t), &pb.MachineRef{Id: id})
				if err == nil && m.GetState() == providertest.StIdle {
					mu.Lock()
					took = append(took, time.Since(start))
					mu.Unlock()
					return
				}
				if err == nil && m.GetState() == providertest.StFailed {
					t.Errorf("%s FAILED: %q", id, m.GetLastError())
					return
				}
				if time.Since(start) > 8*time.Minute {
					t.Errorf("%s not IDLE after 8 min", id)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	all := time.Since(t0)
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("host load average (other work shares this machine): %s", strings.TrimSpace(string(load)))
	t.Logf("MEASURE %d parallel Creates -> IDLE (provider): p50 %s, p95 %s, max %s, all done %s",
		n, percentile(took, 0.5).Round(time.Millisecond), percentile(took, 0.95).Round(time.Millisecond),
		percentile(took, 1).Round(time.Millisecond), all.Round(time.Millisecond))
	for _, i := range []int{0, 1, 2, 3, 4, 5, 6, 7} {
		p.delete(fmt.Sprintf("a/tiny.1/%03d", i))
	}
	for i := 0; i < n; i++ {
		p.waitState(fmt.Sprintf("a/tiny.1/%03d", i), providertest.StSpeculative, 5*time.Minute)
	}

	// The floor: virsh define + start + guest-ping, eight at once.
	dir := t.TempDir()
	var bare []time.Duration
	t0 = time.Now()
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%sbare-%d", prefix(p.inst), i)
		x := fmt.Sprintf(`<domain type='qemu'><name>%s</name><memory unit='MiB'>256</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='q35'>hvm</type><kernel>%s</kernel><initrd>%s</initrd><cmdline>%s</cmdline></os>
<features><acpi/><apic/></features><on_reboot>destroy</on_reboot>
<devices><interface type='user'><model type='virtio'/></interface>
<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
<serial type='pty'><target port='0'/></serial><memballoon model='none'/></devices></domain>`, name, sub.Kernel, sub.Initrd, guestCmdline)
		f := filepath.Join(dir, name+".xml")
		if err := os.WriteFile(f, []byte(x), 0o644); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if _, err := virsh("define", f); err != nil {
				t.Error(err)
				return
			}
			if _, err := virsh("start", name); err != nil {
				t.Error(err)
				return
			}
			for {
				if _, err := virsh("qemu-agent-command", name, `{"execute":"guest-ping"}`); err == nil {
					mu.Lock()
					bare = append(bare, time.Since(start))
					mu.Unlock()
					return
				}
				if time.Since(start) > 8*time.Minute {
					t.Errorf("%s: agent never answered", name)
					return
				}
				if time.Since(start) > 20*time.Second {
					// The host is shared: a guest someone else shut down
					// will never answer.
					// The floor is a reference figure, not what is tested:
					// a guest lost this way (the tiny guest powers off when
					// its boot starves on a loaded host) leaves the floor
					// one sample short, and the log says so.
					if st, err := virsh("domstate", "--reason", name); err == nil && strings.HasPrefix(strings.TrimSpace(st), "shut off") {
						t.Logf("%s: %s before its agent answered; the bare floor is measured without it", name, strings.TrimSpace(st))
						return
					}
				}
				// Each poll forks virsh: poll gently, or the polling itself
				// slows the eight guests on two cores.
				time.Sleep(500 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	sort.Slice(bare, func(i, j int) bool { return bare[i] < bare[j] })
	load, _ = os.ReadFile("/proc/loadavg")
	t.Logf("host load average: %s", strings.TrimSpace(string(load)))
	t.Logf("MEASURE %d of %d parallel virsh define+start+agent (bare floor): p50 %s, p95 %s, max %s, all done %s",
		len(bare), n, percentile(bare, 0.5).Round(time.Millisecond), percentile(bare, 0.95).Round(time.Millisecond),
		percentile(bare, 1).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	// The sweep at cleanup destroys and undefines the bare domains (their
	// names carry the installation prefix).
}
