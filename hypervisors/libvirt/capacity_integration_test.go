//go:build integration

package libvirt

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestIntegrationReadCapacity reads the real daemon's node and pool: the
// node is this machine (its MemTotal and CPUs), the pool the test pool on
// this machine's disk (its size as statfs sees it).
func TestIntegrationReadCapacity(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	c, err := h.ReadCapacity(ctxT(t, time.Minute), "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("zone a: %+v", c)
	// libvirt sums its NUMA cells' memory, which on this VM kind is
	// below /proc/meminfo's MemTotal (19.3 of 25.3 GB here): bounded by it,
	// and most of it.
	if total := memTotal(t); c.MemoryBytes > total || c.MemoryBytes < total/2 {
		t.Errorf("memory %d bytes, want at most MemTotal %d and at least half of it", c.MemoryBytes, total)
	}
	// libvirt counts the host's online CPUs; this process may be
	// pinned to fewer.
	if c.CPUs < runtime.NumCPU() {
		t.Errorf("%d CPUs, want at least the %d this process may use", c.CPUs, runtime.NumCPU())
	}
	if c.StorageName != e.Pool {
		t.Errorf("storage %q, want the pool %q", c.StorageName, e.Pool)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(e.State, &fs); err != nil {
		t.Fatal(err)
	}
	// A directory pool is the file system it lives on; allow for the
	// rounding libvirt applies.
	if size := fs.Blocks * uint64(fs.Bsize); c.DiskBytes == 0 || c.DiskBytes > size+size/100 || c.DiskBytes < size-size/100 {
		t.Errorf("pool capacity %d bytes, want about the file system's %d", c.DiskBytes, size)
	}
	if c.DiskFreeBytes == 0 || c.DiskFreeBytes > c.DiskBytes {
		t.Errorf("pool free %d bytes of %d", c.DiskFreeBytes, c.DiskBytes)
	}
}

func memTotal(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
			kib, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kib * 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}
