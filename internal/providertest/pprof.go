package providertest

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Pprof is a provider process's /debug/pprof/ endpoint, for benchmarks
// run with PprofDirEnv set (the binary then serves net/http/pprof and
// writes its address as PID.addr in that directory).
type Pprof struct {
	Dir    string // where profiles are written
	Secs   int    // how long a timed profile covers
	base   string
	client *http.Client
}

// ProfileDir is where a benchmark writes profiles: PprofDirEnv's
// directory, or "" (no profiles) without it or for a benchmark's one-op
// warm-up (fewer than 100 ops).
func ProfileDir(b *testing.B) string {
	if b.N < 100 {
		return ""
	}
	return os.Getenv(PprofDirEnv)
}

// PprofOf returns pid's endpoint, or nil without PprofDirEnv or for a
// benchmark's one-op warm-up (fewer than 100 ops). A timed profile
// covers secs seconds unless PROVIDERTEST_PPROF_SECONDS says otherwise;
// every fetch is bounded by that plus a minute.
func PprofOf(b *testing.B, pid, secs int) *Pprof {
	dir := ProfileDir(b)
	if dir == "" {
		return nil
	}
	if v, err := strconv.Atoi(os.Getenv("PROVIDERTEST_PPROF_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	raw, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(pid)+".addr"))
	if err != nil {
		b.Fatalf("profiling: the provider (pid %d) wrote no pprof address: %v", pid, err)
	}
	return &Pprof{Dir: dir, Secs: secs, base: "http://" + strings.TrimSpace(string(raw)) + "/debug/pprof/",
		client: &http.Client{Timeout: time.Duration(secs)*time.Second + time.Minute}}
}

// Save fetches path (under /debug/pprof/) into file in Dir; a failure is
// reported on tb and ends nothing else.
func (p *Pprof) Save(tb testing.TB, path, file string) {
	resp, err := p.client.Get(p.base + path)
	if err != nil {
		tb.Errorf("profiling: %s: %v", path, err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Errorf("profiling: %s: %s %v %.200s", path, resp.Status, err, body)
		return
	}
	if err := os.WriteFile(filepath.Join(p.Dir, file), body, 0o644); err != nil {
		tb.Error(err)
	}
}
