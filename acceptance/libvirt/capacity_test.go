//go:build integration

package libvirt

import (
	"context"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/jsonplan"
)

// nodeMemoryMiB is the host's memory as virsh nodeinfo reports it.
func nodeMemoryMiB(t *testing.T) uint64 {
	t.Helper()
	m := regexp.MustCompile(`Memory size:\s+(\d+) KiB`).FindStringSubmatch(mustVirsh(t, "nodeinfo"))
	if m == nil {
		t.Fatal("virsh nodeinfo has no memory size")
	}
	kib, _ := strconv.ParseUint(m[1], 10, 64)
	return kib >> 10
}

// TestCreateLargerThanTheHost: on the real libvirtd, the plan's capacity
// section carries the host's figures (virsh nodeinfo's memory, the pool);
// a Create of an instance type larger than the host fails without
// defining anything, last_error naming host memory with the figures.
// Under --capacity-check=off nothing is checked before: the hypervisor's
// own refusal (qemu cannot allocate the guest's memory) fails the Create,
// terminal and named as an out-of-memory error, not retried until the
// deadline.
func TestCreateLargerThanTheHost(t *testing.T) {
	t.Parallel()
	hostMiB := nodeMemoryMiB(t)
	t.Logf("MEASURE virsh nodeinfo memory: %d MiB", hostMiB)
	for _, check := range []string{"warn", "off"} {
		t.Run(check, func(t *testing.T) {
			p := startProvider(t, config{connect: "a=" + sub.URI, pools: "a=" + sub.Pool,
				offerings: []offering{{InstanceType: "huge.1", Zone: "a", Count: 1}},
				extra:     []string{"--capacity-check", check, "--create-timeout", "3m"}})
			const id = "a/huge.1/000"
			if check == "warn" {
				pl := waitCapacity(t, p)
				z := pl.Capacity.Zones[0]
				t.Logf("MEASURE plan capacity zone a: host %d CPUs, %d MiB, pool %+v; offered %+v; ratios cpu %v memory %v; over %v",
					z.Host.CPUs, z.Host.MemoryBytes>>20, z.Host.Disk, z.Offered, *z.CPURatio, *z.MemoryRatio, z.Over)
				if z.Host.MemoryBytes>>20 != hostMiB || z.Host.Disk == nil || z.Host.Disk.Storage != sub.Pool || z.Host.Disk.TotalBytes == 0 ||
					z.Offered.MemoryBytes != 1<<40 || len(z.Over) == 0 || z.Over[len(z.Over)-1] != "memory" {
					t.Errorf("capacity of zone a %+v: want the host's %d MiB, the pool %s, 1 TiB offered, memory over", z, hostMiB, sub.Pool)
				}
				out, err := exec.Command(binary, append([]string{"plan", "--no-color"}, p.Argv()[1:]...)...).CombinedOutput()
				if err != nil || !strings.Contains(string(out), "memory  1048576 MiB offered on "+strconv.FormatUint(hostMiB, 10)+" MiB") {
					t.Errorf("offline text plan (%v) lacks the host's memory:\n%s", err, out)
				}
			}
			t0 := p.create(id)
			m := p.waitState(id, providertest.StFailed, 4*time.Minute)
			t.Logf("MEASURE --capacity-check=%s: Create of 1 TiB FAILED after %s: %q", check, time.Since(t0).Round(time.Millisecond), m.GetLastError())
			if check == "warn" {
				want := "create failed: host memory: zone a has " + strconv.FormatUint(hostMiB, 10) + " MiB free, the machine needs 1048576 MiB"
				if m.GetLastError() != want {
					t.Errorf("last_error %q, want %q", m.GetLastError(), want)
				}
				if left := domains(t, prefix(p.inst)); len(left) != 0 {
					t.Errorf("domains defined for a Create the host cannot hold: %v", left)
				}
				return
			}
			if !strings.Contains(m.GetLastError(), "memory: host out of resources") || strings.Contains(m.GetLastError(), "timed out") {
				t.Errorf("last_error %q: want the hypervisor's out-of-memory refusal, named, not a timeout", m.GetLastError())
			}
		})
	}
}

// waitCapacity polls /debug/plan until zone a's host has been read.
func waitCapacity(t *testing.T, p *provider) *jsonplan.Plan {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		st, body := p.HTTPGet("/debug/plan")
		if st == http.StatusOK {
			pl, err := jsonplan.Decode([]byte(body))
			if err != nil {
				t.Fatalf("/debug/plan: %v", err)
			}
			if pl.Capacity != nil && len(pl.Capacity.Zones) == 1 && pl.Capacity.Zones[0].Status == "ok" {
				return pl
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("zone a's capacity never read: %d %s", st, body)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
