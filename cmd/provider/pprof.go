//go:build pprof

package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
)

// A build with -tags pprof (never the released one: make build and the
// image do not pass it) serves net/http/pprof when PROVIDERTEST_PPROF_DIR
// names a directory: on a loopback port of its own, whose address it
// writes to DIR/<pid>.addr, with block and mutex profiling on. The black-box
// suites build the provider this way when that variable is set
// (providertest.Build), so a benchmark's provider can be profiled from
// outside while it runs (docs/high-availability.md, "Profiling").
func init() {
	dir := os.Getenv(pprofDirEnv)
	if dir == "" {
		return
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "pprof: listen: %v\n", err)
		os.Exit(2)
	}
	path := filepath.Join(dir, strconv.Itoa(os.Getpid())+".addr")
	if err := os.WriteFile(path, []byte(l.Addr().String()), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "pprof: write %s: %v\n", path, err)
		os.Exit(2)
	}
	// Every blocking event and every contended mutex: a profiling build
	// only, where the overhead is accepted.
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)
	// PROVIDERTEST_MEMPROFILERATE samples allocations more finely than
	// the runtime's one per 512 KiB, for exacter allocation profiles.
	if v, err := strconv.Atoi(os.Getenv("PROVIDERTEST_MEMPROFILERATE")); err == nil && v > 0 {
		runtime.MemProfileRate = v
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }()
}

// pprofDirEnv is providertest.PprofDirEnv (main cannot import a test
// toolkit).
const pprofDirEnv = "PROVIDERTEST_PPROF_DIR"
