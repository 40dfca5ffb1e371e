package e2e

import (
	"fmt"
	"sync"
	"testing"

	"github.com/bigfleet-vm/provider/internal/providertest"
)

// metrics is one scrape of the provider's /metrics.
func (s *server) metrics() string {
	_, body := s.HTTPGet("/metrics")
	return body
}

// profileProvider, when providertest.PprofDirEnv names a directory (the
// provider was then built to serve net/http/pprof), writes the provider's
// allocation profile (after a GC, so that it is current) before and after
// a benchmark's run (name-allocs0.pprof
// and name-allocs1.pprof: compare them with `go tool pprof -base`) and a
// CPU profile of its first PROVIDERTEST_PPROF_SECONDS seconds (default 5)
// as name-cpu.pprof. Call it just before the timed run and the returned
// done just after. Without the variable, or for fewer than 100 ops, it
// does nothing. Profiles only ever run by hand.
func profileProvider(b *testing.B, s *server, name string) (done func()) {
	p := providertest.PprofOf(b, s.Pid(), 5)
	if p == nil {
		return func() {}
	}
	p.Save(b, "heap?gc=1", name+"-allocs0.pprof")
	var wg sync.WaitGroup
	wg.Go(func() { p.Save(b, fmt.Sprintf("profile?seconds=%d", p.Secs), name+"-cpu.pprof") })
	return func() {
		p.Save(b, "heap?gc=1", name+"-allocs1.pprof")
		wg.Wait()
	}
}
