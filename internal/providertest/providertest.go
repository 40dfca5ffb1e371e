package providertest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/internal/freeport"
)

// PprofDirEnv names a directory: when set, Build makes a profiling
// provider that serves net/http/pprof on a loopback port of its own and
// writes that address to DIR/<pid>.addr (block and mutex profiling on).
// For profiling a benchmark's provider from outside; never set by a test.
const PprofDirEnv = "PROVIDERTEST_PPROF_DIR"

// Build compiles ./cmd/provider of the enclosing module into a temporary
// directory and returns the binary's path and a cleanup function. When
// the tests run with -race, so does the binary; check its output with
// NoRace. With PprofDirEnv set, the binary is built with -tags pprof
// and serves net/http/pprof (see cmd/provider/pprof.go).
func Build(prefix string) (binary string, cleanup func(), err error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", nil, fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	binary = filepath.Join(dir, "provider")
	args := []string{"build", "-o", binary}
	if RaceEnabled {
		args = append(args, "-race")
	}
	if os.Getenv(PprofDirEnv) != "" {
		args = append(args, "-tags", "pprof")
	}
	build := exec.Command("go", append(args, "./cmd/provider")...)
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build provider: %w", err)
	}
	return binary, func() { os.RemoveAll(dir) }, nil
}

// FreeAddr returns a loopback address that was free a moment ago, outside
// the ephemeral port range (see package freeport).
func FreeAddr(t testing.TB) string {
	t.Helper()
	return FreeAddrs(t, 1)[0]
}

// FreeAddrs returns n distinct loopback addresses that were free a
// moment ago (a provider given one port for --addr and --metrics-addr
// refuses to start), outside the ephemeral port range.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs, err := freeport.Addrs(n)
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

// ErrExited is returned by WaitReady when the process exits first.
var ErrExited = errors.New("provider exited")

// WaitReady polls http://metricsAddr/readyz until it answers 200, the
// process exits (done is closed), or max passes.
func WaitReady(metricsAddr string, done <-chan struct{}, max time.Duration) error {
	return WaitHTTP(metricsAddr, "/readyz", done, max)
}

// WaitHTTP polls http://metricsAddr+path (/readyz when path is empty)
// until it answers 200, the process exits (done is closed), or max
// passes.
func WaitHTTP(metricsAddr, path string, done <-chan struct{}, max time.Duration) error {
	if path == "" {
		path = "/readyz"
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(max); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-done:
			return ErrExited
		default:
		}
		resp, err := hc.Get("http://" + metricsAddr + path)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("%s did not answer 200 within %v", path, max)
}

// raceReport is how the race detector starts a report.
const raceReport = "WARNING: DATA RACE"

// NoRace fails t if a provider's output holds a race detector report, and
// prints the report.
func NoRace(t testing.TB, name, output string) {
	t.Helper()
	i := strings.Index(output, raceReport)
	if i < 0 {
		return
	}
	report := output[i:]
	if end := strings.Index(report, "=================="); end > 0 {
		report = report[:end]
	}
	t.Errorf("%s: the race detector reported a data race:\n%s", name, report)
}

// SyncBuffer collects a subprocess's output; safe for concurrent use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Len is the number of bytes written so far.
func (s *SyncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}
