package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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
	dir := os.Getenv(providertest.PprofDirEnv)
	if dir == "" || b.N < 100 {
		return func() {}
	}
	secs := 5
	if v, err := strconv.Atoi(os.Getenv("PROVIDERTEST_PPROF_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	raw, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(s.Pid())+".addr"))
	if err != nil {
		b.Fatalf("profiling: the provider (pid %d) wrote no pprof address: %v", s.Pid(), err)
	}
	base := "http://" + strings.TrimSpace(string(raw)) + "/debug/pprof/"
	client := &http.Client{Timeout: time.Duration(secs)*time.Second + time.Minute}
	fetch := func(path, file string) { providertest.SaveProfile(b, client, base+path, filepath.Join(dir, file)) }
	fetch("heap?gc=1", name+"-allocs0.pprof")
	var wg sync.WaitGroup
	wg.Go(func() { fetch(fmt.Sprintf("profile?seconds=%d", secs), name+"-cpu.pprof") })
	return func() {
		fetch("heap?gc=1", name+"-allocs1.pprof")
		wg.Wait()
	}
}
