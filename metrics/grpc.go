package metrics

import (
	"context"

	"google.golang.org/grpc"
)

// UnaryServerInterceptor counts and times unary RPCs into the standard
// grpc_server_* metrics. Chain it outside any interceptor that turns a
// panic into an error, so a recovered panic is counted as its code.
func (m *Metrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	if m == nil {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(ctx, req)
		}
	}
	return m.grpc.UnaryServerInterceptor()
}

// StreamServerInterceptor is UnaryServerInterceptor for streams (health
// Watch, reflection).
func (m *Metrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	if m == nil {
		return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, ss)
		}
	}
	return m.grpc.StreamServerInterceptor()
}

// InitializeGRPC pre-creates the grpc_server_* series of every method
// registered on gs with zero values, so rates and error ratios exist
// before the first call. Call it after registering every service.
func (m *Metrics) InitializeGRPC(gs *grpc.Server) {
	if m == nil {
		return
	}
	m.grpc.InitializeMetrics(gs)
}

// RPCRejected counts one unary RPC answered with code (not OK) in
// bigfleet_provider_rpc_rejected_total{method,code}. method is the full
// gRPC method name; only registered methods reach the interceptors, so
// both labels come from closed sets.
func (m *Metrics) RPCRejected(method, code string) {
	if m == nil {
		return
	}
	m.rejected.WithLabelValues(method, code).Inc()
}
