//go:build ha

package ha

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"testing"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// profileSeconds is how long a profile of the leader covers when
// providertest.PprofDirEnv is set (PROVIDERTEST_PPROF_SECONDS overrides).
const profileSeconds = 15

// profileLeader, when providertest.PprofDirEnv names a directory (the
// replicas were then built to serve net/http/pprof), starts taking the
// leader's CPU, block and mutex profiles (deltas) and a short runtime
// trace, as name-cpu.pprof, name-block.pprof, name-mutex.pprof and
// name.trace in that directory; the returned wait blocks until they are
// written. Without the variable, or for fewer than 100 ops, it does
// nothing. Profiles only ever run
// by hand: see docs/high-availability.md, "Profiling".
func profileLeader(b *testing.B, rep *providertest.Provider, name string) (wait func()) {
	p := providertest.PprofOf(b, rep.Pid(), profileSeconds)
	if p == nil {
		return func() {}
	}
	var wg sync.WaitGroup
	for file, path := range map[string]string{
		name + "-cpu.pprof":   fmt.Sprintf("profile?seconds=%d", p.Secs),
		name + "-block.pprof": fmt.Sprintf("block?seconds=%d", p.Secs),
		name + "-mutex.pprof": fmt.Sprintf("mutex?seconds=%d", p.Secs),
		name + ".trace":       "trace?seconds=2",
	} {
		wg.Go(func() { p.Save(b, path, file) })
	}
	return wg.Wait
}

// profileHere, when providertest.PprofDirEnv names a directory, takes a
// CPU profile of this process (the three embedded etcd members and the
// benchmark's clients) until the returned stop is called, as
// name-here-cpu.pprof: etcd's side of what profileLeader shows. Without
// the variable, or for fewer than 100 ops, it does nothing.
func profileHere(b *testing.B, name string) (stop func()) {
	dir := providertest.ProfileDir(b)
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, name+"-here-cpu.pprof"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatalf("profiling this process: %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}
