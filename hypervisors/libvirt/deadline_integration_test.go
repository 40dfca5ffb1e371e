//go:build integration

package libvirt

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
)

// A seed upload that outlives UploadTimeout is aborted through libvirt's
// stream abort: CreateSeed fails retryably, the same connection keeps
// serving (no redial, the zone stays up), the half-written volume carries
// no identity and can be deleted.
func TestIntegrationSeedUploadAbort(t *testing.T) {
	e := needEnv(t)
	h, err := New(Config{Zones: []ZoneURI{{Zone: "a", URI: e.URI}}, Installation: "it-" + randHex(4), Pool: e.Pool,
		UploadTimeout: time.Second}, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	ctx := ctxT(t, 2*time.Minute)
	if err := h.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	m := newMachine(h, "upload-abort")
	cleanupMachine(t, h, "a", e.Pool, m)
	h.uploadChunk = 4096
	// The first chunk goes; the next waits out the upload's deadline.
	var mu sync.Mutex
	chunks := 0
	h.uploadPace = func(ctx context.Context) {
		mu.Lock()
		chunks++
		n := chunks
		mu.Unlock()
		if n > 1 {
			<-ctx.Done()
		}
	}
	zc := h.zones["a"]
	zc.mu.Lock()
	gen := zc.gen
	zc.mu.Unlock()
	spec := lvspec.SeedSpec{Pool: e.Pool, Name: m.seed, InstanceID: "upload-abort", Hostname: m.name}
	err = h.CreateSeed(ctx, "a", spec)
	if !errors.Is(err, hypervisors.ErrTransient) || !strings.Contains(err.Error(), "upload aborted") {
		t.Fatalf("CreateSeed past its upload deadline: %v, want a retryable 'upload aborted'", err)
	}
	t.Logf("aborted: %v", err)
	h.uploadPace = nil
	z, err := h.Observe(ctx, "a")
	if err != nil {
		t.Fatalf("Observe after the abort: %v", err)
	}
	zc.mu.Lock()
	same := zc.gen == gen && zc.lv != nil
	zc.mu.Unlock()
	if !same || h.ZoneHealth()["a"] != nil {
		t.Errorf("connection replaced (%t) or zone unhealthy (%v) after an aborted upload", !same, h.ZoneHealth()["a"])
	}
	for _, v := range z.Volumes {
		if v.Name == m.seed && v.Identity != "" {
			t.Errorf("aborted seed observes with identity %q", v.Identity)
		}
	}
	if err := h.DeleteVolume(ctx, "a", e.Pool, m.seed); err != nil {
		t.Errorf("delete the aborted seed: %v", err)
	}
	// And a whole upload still works on the same connection.
	if err := h.CreateSeed(ctx, "a", spec); err != nil {
		t.Errorf("CreateSeed after the abort: %v", err)
	}
}

// libvirtd stopped (SIGSTOP: every connection to it goes silent at once,
// the sockets stay open) with a call in flight on each transport: every
// call returns with a retryable ErrUnreachable within the probe's
// DeadAfter, not its own deadline (an hour here), every connection is
// closed, and when the daemon resumes every zone is redialled and answers.
func TestIntegrationWedgedDaemonEveryTransport(t *testing.T) {
	e := needEnv(t)
	tr := needTransports(t)
	zones := []ZoneURI{
		{Zone: "unix", URI: e.URI},
		{Zone: "tls", URI: tr.tlsURI(tr.tlsPort, "client")},
		{Zone: "libssh", URI: tr.libsshURI(tr.knownHosts)},
		{Zone: "ssh", URI: tr.sshURI()},
	}
	h, err := New(Config{Zones: zones, Installation: "it-" + randHex(4), Pool: e.Pool, CallTimeout: time.Hour,
		ProbeEvery: 250 * time.Millisecond, ProbeTimeout: time.Second, DeadAfter: 3 * time.Second, DialTimeout: 5 * time.Second,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	ctx := ctxT(t, 3*time.Minute)
	if err := h.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	gens := map[string]uint64{}
	for _, z := range zones {
		if err := h.ZoneHealth()[z.Zone]; err != nil {
			t.Fatalf("zone %s: %v", z.Zone, err)
		}
		h.zones[z.Zone].mu.Lock()
		gens[z.Zone] = h.zones[z.Zone].gen
		h.zones[z.Zone].mu.Unlock()
	}
	pid := daemonPID(t)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	stopped := time.Now()
	type result struct {
		zone string
		err  error
		took time.Duration
	}
	res := make(chan result, len(zones))
	for _, z := range zones {
		go func() {
			t0 := time.Now()
			_, err := h.Lookup(context.Background(), hypervisors.Target{Zone: z.Zone, Name: "bf-no-such-domain"})
			res <- result{z.Zone, err, time.Since(t0)}
		}()
	}
	for range zones {
		select {
		case r := <-res:
			t.Logf("MEASURE %s: call on the stopped daemon returned after %s: %v", r.zone, r.took.Round(time.Millisecond), r.err)
			if !errors.Is(r.err, hypervisors.ErrUnreachable) || !hypervisors.Retryable(r.err) {
				t.Errorf("%s: %v, want a retryable ErrUnreachable", r.zone, r.err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a call on the stopped daemon is still waiting after a minute")
		}
	}
	t.Logf("MEASURE all four calls released %s after SIGSTOP", time.Since(stopped).Round(time.Millisecond))
	resume()
	t0 := time.Now()
	for _, z := range zones {
		for {
			if _, err := h.Lookup(ctx, hypervisors.Target{Zone: z.Zone, Name: "bf-no-such-domain"}); errors.Is(err, hypervisors.ErrNotFound) {
				break
			} else if ctx.Err() != nil {
				t.Fatalf("%s never answered again: %v", z.Zone, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		h.zones[z.Zone].mu.Lock()
		g := h.zones[z.Zone].gen
		h.zones[z.Zone].mu.Unlock()
		if g == gens[z.Zone] {
			t.Errorf("%s answers on its old connection: it was never closed and redialled", z.Zone)
		}
	}
	t.Logf("MEASURE every zone answering again %s after SIGCONT", time.Since(t0).Round(time.Millisecond))
}
