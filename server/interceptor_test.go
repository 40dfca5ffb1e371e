package server

import (
	"context"
	"log/slog"
	"net"
	"testing"

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
