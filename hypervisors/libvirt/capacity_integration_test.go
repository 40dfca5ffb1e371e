//go:build integration

package libvirt

import (
	"bufio"
	"os"
	"path/filepath"
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
	before := nodeMemory(t)
	c, err := h.ReadCapacity(ctxT(t, time.Minute), "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("zone a: %+v", c)
	// libvirt reports the sum of its NUMA cells' memory, not
	// /proc/meminfo's MemTotal, and on the VMs CI runs on the cells hold a
	// part of MemTotal that moves as memory is plugged (3.8, 8.4 and 19.3 of
	// 25.3 GB seen): read the cells on both sides of the call and want the
	// answer between them.
	if lo, hi := memBounds(t, before, nodeMemory(t)); c.MemoryBytes < lo || c.MemoryBytes > hi {
		t.Errorf("memory %d bytes, want the NUMA cells' %d..%d", c.MemoryBytes, lo, hi)
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

// nodeMemory is what libvirt counts as the host's memory: the sum of the
// NUMA cells' MemTotal, or /proc/meminfo's where the kernel shows no cells.
func nodeMemory(t *testing.T) uint64 {
	t.Helper()
	cells, err := filepath.Glob("/sys/devices/system/node/node[0-9]*/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) == 0 {
		return meminfo(t, "/proc/meminfo", "MemTotal:")
	}
	var sum uint64
	for _, c := range cells {
		node := strings.TrimPrefix(filepath.Base(filepath.Dir(c)), "node")
		sum += meminfo(t, c, "Node "+node+" MemTotal:")
	}
	return sum
}

// memBounds is the range two reads of the cells span, widened by 1% for the
// rounding to pages.
func memBounds(t *testing.T, a, b uint64) (lo, hi uint64) {
	t.Helper()
	lo, hi = min(a, b), max(a, b)
	return lo - lo/100, hi + hi/100
}

// meminfo reads one "<prefix> N kB" line of a meminfo file, in bytes.
func meminfo(t *testing.T, path, prefix string) uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), prefix); ok {
			kib, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kib * 1024
		}
	}
	t.Fatalf("no %q in %s", prefix, path)
	return 0
}
