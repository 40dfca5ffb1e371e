package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/bigfleet-vm/provider/metrics"
)

// panicky is a health server whose Check panics.
type panicky struct{ *health.Server }

func (panicky) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	panic("boom")
}

// TestInterceptorsCountRecoveredPanics checks the chain's order: a panic
// becomes codes.Internal, the process survives, and the standard gRPC
// metrics count the call under Internal.
func TestInterceptorsCountRecoveredPanics(t *testing.T) {
	p := &Provider{log: slog.New(slog.DiscardHandler), Metrics: metrics.New(nil, nil)}
	gs := grpc.NewServer(p.interceptors()...)
	healthpb.RegisterHealthServer(gs, panicky{health.NewServer()})
	p.Metrics.InitializeGRPC(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := healthpb.NewHealthClient(conn)
	for range 2 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if got := status.Code(err); got != codes.Internal {
			t.Fatalf("Check: code %v (%v), want Internal", got, err)
		}
	}
	fams, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	handled := map[string]float64{}
	builds := 0
	for _, f := range fams {
		if f.GetName() == "bigfleet_provider_build_info" {
			builds = len(f.GetMetric())
		}
		if f.GetName() != "grpc_server_handled_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["grpc_method"] == "Check" && m.GetCounter().GetValue() > 0 {
				handled[l["grpc_code"]] = m.GetCounter().GetValue()
			}
		}
	}
	if diff := cmp.Diff(map[string]float64{"Internal": 2}, handled); diff != "" {
		t.Errorf("grpc_server_handled_total{grpc_method=Check} by code (-want +got):\n%s", diff)
	}
	if builds != 1 {
		t.Errorf("bigfleet_provider_build_info has %d series, want 1", builds)
	}
}

// TestRejectedRPCLogsSampled floods the server with rejected calls: every
// one is counted in bigfleet_provider_rpc_rejected_total{method,code},
// but only the first rejectLogBurst of a window are logged one by one,
// then one line says how many more there were (60 MB of WARN lines in
// 10 s before).
func TestRejectedRPCLogsSampled(t *testing.T) {
	var buf syncBuffer
	p := &Provider{log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), Metrics: metrics.New(nil, nil)}
	clock := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	p.rejects.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }

	gs := grpc.NewServer(p.interceptors()...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := healthpb.NewHealthClient(conn)
	flood := func(n int) {
		for range n {
			_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "no-such-service"})
			if got := status.Code(err); got != codes.NotFound {
				t.Fatalf("Check: code %v (%v), want NotFound", got, err)
			}
		}
	}
	const method = "/grpc.health.v1.Health/Check"
	type line struct {
		Msg, Method, Code string
		Count             int
	}
	lines := func() []line {
		var out []line
		for _, raw := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if raw == "" {
				continue
			}
			var l line
			if err := json.Unmarshal([]byte(raw), &l); err != nil {
				t.Fatalf("log line %q: %v", raw, err)
			}
			out = append(out, l)
		}
		return out
	}
	rpc := line{Msg: "rpc", Method: method, Code: "NotFound"}

	flood(200)
	want := []line{rpc, rpc, rpc, rpc, rpc}
	if diff := cmp.Diff(want, lines()); diff != "" {
		t.Errorf("log after 200 rejections in one window (-want +got):\n%s", diff)
	}
	// The next window's first rejection first says what the last one
	// left out, then is logged itself.
	advance(rejectLogWindow)
	flood(7)
	want = append(want, line{Msg: "rpc rejections not logged", Method: method, Code: "NotFound", Count: 195}, rpc, rpc, rpc, rpc, rpc)
	if diff := cmp.Diff(want, lines()); diff != "" {
		t.Errorf("log after the next window (-want +got):\n%s", diff)
	}
	// A window that ends without a further rejection is summarised by
	// the flusher.
	advance(rejectLogWindow)
	logSuppressed(context.Background(), p.log, p.rejects.roll(p.rejects.clock()))
	want = append(want, line{Msg: "rpc rejections not logged", Method: method, Code: "NotFound", Count: 2})
	if diff := cmp.Diff(want, lines()); diff != "" {
		t.Errorf("log after the flush (-want +got):\n%s", diff)
	}

	fams, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	rejected := map[[2]string]float64{}
	for _, f := range fams {
		if f.GetName() != "bigfleet_provider_rpc_rejected_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			rejected[[2]string{l["method"], l["code"]}] = m.GetCounter().GetValue()
		}
	}
	if diff := cmp.Diff(map[[2]string]float64{{method, "NotFound"}: 207}, rejected); diff != "" {
		t.Errorf("bigfleet_provider_rpc_rejected_total (-want +got):\n%s", diff)
	}
}

// syncBuffer is a bytes.Buffer safe for the handler's and the test's
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
