package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/metrics"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/planner"
	"github.com/bigfleet-vm/provider/plugin"
	"github.com/bigfleet-vm/provider/service"
	"github.com/bigfleet-vm/provider/statefile"
)

// maxRecvBytes admits a bootstrap blob at its cap plus metadata.
const maxRecvBytes = desired.MaxBlobBytes + 2<<20

// Logger builds the slog logger the flags ask for.
func Logger(cfg *config.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Provider is an assembled, not yet serving provider. What acts on the
// desired state lives in a term (term.go): a single replica has one for
// its life; a replica of an etcd state has one while it leads and none
// while it stands by.
type Provider struct {
	cfg     *config.Config
	log     *slog.Logger
	Metrics *metrics.Metrics
	cur     atomic.Pointer[term] // the term served; nil on a standby
	ha      *replica             // set with an etcd state
	plans   *planCache           // /debug/plan; set when the metrics listener serves
	rejects rejectLog            // samples the log lines of rejected RPCs
	syncing int                  // goroutines blocking in fsync: SyncingGoroutines
}

// Build assembles the provider. Nothing listens yet.
func Build(ctx context.Context, cfg *config.Config, log *slog.Logger) (*Provider, error) {
	p := &Provider{cfg: cfg, log: log}
	p.Metrics = metrics.New(func() map[[3]string]int {
		if t := p.cur.Load(); t != nil {
			return t.doc.Counts()
		}
		return nil
	}, func() float64 {
		if t := p.cur.Load(); t != nil {
			return float64(t.store.Size())
		}
		return 0
	})
	p.Metrics.ReconcileInterval(cfg.ReconcileInterval)
	p.Metrics.SetProvider(cfg.Provider)
	// state_healthy: the serving term's store can commit (its lease
	// holds); a standby's store can be read.
	p.Metrics.StateHealth(func() error {
		if t := p.cur.Load(); t != nil {
			if t.guard != nil {
				if err := t.guard(); err != nil {
					return err
				}
			}
			return t.doc.Healthy()
		}
		if p.ha != nil {
			return p.ha.follow.health()
		}
		return nil
	})
	// zone_up and /readyz read the same live status.
	p.Metrics.SetZoneHealth(p.zoneHealth)
	certExpiry(cfg, log, p.Metrics)

	if cfg.Etcd != nil {
		// Replicas of an etcd state build a term only while they lead.
		r, err := p.newReplica(ctx)
		if err != nil {
			return nil, err
		}
		p.ha = r
		p.Metrics.FollowLag(func() (float64, bool) {
			if p.current() != nil {
				return 0, true // the leader writes the state
			}
			return r.follow.lag(), true
		})
		return p, nil
	}
	var store stateStore
	if cfg.StatePath != "" {
		f, err := statefile.Open(cfg.StatePath, statefile.Options{Logger: log, OnCommit: func(records, bytes int, fsync time.Duration) {
			p.Metrics.Commit(records, bytes, fsync)
		}, Pinned: desired.Pinned, LossKey: desired.LossKey, Recover: cfg.StateRecover})
		if err != nil {
			var ce *statefile.CorruptError
			if errors.As(err, &ce) && ce.Recoverable {
				err = fmt.Errorf("%w; to start past it, dropping what follows and keeping operation ids and fences safe, start once with --state-recover=truncate (docs/operations.md)", err)
			}
			return nil, err
		}
		store = journaled{f}
		p.syncing = statefile.SyncingGoroutines
	} else {
		store = journaled{desired.NewMemoryStore(nil)}
	}
	t, err := openTerm(ctx, cfg, log, p.Metrics, store, nil, nil)
	if err != nil {
		return nil, err
	}
	p.setTerm(t)
	return p, nil
}

// SyncingGoroutines is how many of the provider's goroutines spend most
// of their time blocked in a sync of its state (statefile.SyncingGoroutines
// on a local journal; 0 in memory and on etcd, whose syncs are in another
// process). The process needs as many Ps on top of the default.
func (p *Provider) SyncingGoroutines() int { return p.syncing }

// setTerm makes t the term this replica serves (nil: none, a standby),
// and its metrics the ones exported.
func (p *Provider) setTerm(t *term) {
	p.cur.Store(t)
	if t == nil {
		p.Metrics.Serve(nil)
		return
	}
	p.Metrics.Serve(t.metrics)
}

// current returns the term this replica serves, or nil on a standby.
func (p *Provider) current() *term { return p.cur.Load() }

// zoneHealth is the current hypervisor's live zone status (nil without
// one).
func (p *Provider) zoneHealth() map[string]error {
	if t := p.cur.Load(); t != nil {
		if h := hypervisors.CapabilitiesOf(t.raw).Health; h != nil {
			return h.ZoneHealth()
		}
	}
	return nil
}

// Document is the service's source: the current term's document, or an
// Unavailable error on a replica that serves none. A term whose lease
// deadline has passed serves nothing, even before the replica's timers
// noticed: a replica resumed after a pause past its lease must not answer
// from the document a standby has taken over meanwhile.
func (p *Provider) Document() (*desired.Document, error) {
	if t := p.cur.Load(); t != nil && (t.guard == nil || t.guard() == nil) {
		return t.doc, nil
	}
	if p.ha != nil {
		return nil, p.ha.standbyError()
	}
	return nil, &desired.Error{Code: desired.CodeUnavailable, Msg: "this replica is not serving the desired state"}
}

// docOptions configures the desired document from the flags.
func docOptions(cfg *config.Config, store desired.Store) desired.Options {
	return desired.Options{
		Store:               store,
		Installation:        cfg.InstallationID,
		DefaultInstallation: cfg.Provider,
		Timeouts: map[desired.Kind]time.Duration{desired.KindCreate: cfg.Timeouts.Create, desired.KindConfigure: cfg.Timeouts.Configure,
			desired.KindDrain: cfg.Timeouts.Drain, desired.KindDelete: cfg.Timeouts.Delete},
		DeleteSupported: !cfg.BareMetal,
		VMName:          naming.VMName,
		History:         desired.HistoryOptions{Events: cfg.HistoryEvents, Total: cfg.HistoryTotal, Retention: cfg.HistoryRetention, Redrive: redriveCause(cfg)},
	}
}

// redriveCause is the cause a machine's history gives a transition
// re-driven when the document opens: on etcd a term opens it after
// another term (or another replica) ended, a fail-over; on the local
// journal it is a restart.
func redriveCause(cfg *config.Config) string {
	if cfg.Etcd != nil {
		return desired.CauseFailover
	}
	return desired.CauseRestart
}

// desiredSlots converts the inventory's slots for the desired document.
func desiredSlots(cfg *config.Config) []desired.Slot {
	slots := make([]desired.Slot, 0, len(cfg.Slots))
	for _, s := range cfg.Slots {
		slots = append(slots, desired.Slot{ID: s.ID, Zone: s.Zone, InstanceType: s.Type.Name, Capacity: string(s.Capacity),
			VCPU: s.Type.VCPU, MemoryMiB: s.Type.MemoryMiB, Source: s.Type.Source, Price: s.PricePerHour,
			Resources: s.Resources, Labels: s.Labels})
	}
	return slots
}

// plannerConfig is what the planner needs: the resolved hypervisor's
// planning half (with the simulator's defaults on the fake backend) and
// the core settings.
func plannerConfig(cfg *config.Config, installation string) planner.Config {
	sim := cfg.Backend == config.BackendFake
	pc := planner.Config{Plugin: cfg.Plugin.Planner(plugin.PlannerOptions{Simulated: sim}), Installation: installation,
		NodeReadyExec: cfg.NodeReadyExec, StopGrace: 60 * time.Second, ReapFailed: true}
	if sim && cfg.Fake.Faults && len(pc.NodeReadyExec) == 0 {
		// The conformance fault convention's fault-readiness-block needs a
		// readiness gate; the simulated guest answers this command.
		pc.NodeReadyExec = []string{plugin.SimReadyCommand}
	}
	return pc
}

// Close releases what the current term holds (the hypervisor, the state
// store).
func (p *Provider) Close() error {
	var errs []error
	p.Metrics.Serve(nil)
	if t := p.cur.Swap(nil); t != nil {
		errs = append(errs, t.close())
	}
	if p.ha != nil {
		errs = append(errs, p.ha.client.Close())
	}
	return errors.Join(errs...)
}

// Serve runs until ctx is done, then shuts down gracefully.
func (p *Provider) Serve(ctx context.Context) error {
	cfg, log := p.cfg, p.log
	svc := service.New(p, cfg.Provider)
	gopts := append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecvBytes),
		grpc.ForceServerCodecV2(svc.Codec()),
	}, limitOptions()...)
	gopts = append(gopts, p.interceptors()...)
	security := "insecure"
	if cfg.TLS.Enabled() {
		tc, err := serverTLS(cfg.TLS)
		if err != nil {
			return err
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tc)))
		security = "tls"
		if cfg.TLS.Mutual() {
			security = "mtls"
		}
	}
	gs := grpc.NewServer(gopts...)
	pb.RegisterCapacityProviderServer(gs, svc)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	if cfg.Reflection {
		reflection.Register(gs)
	}
	p.Metrics.InitializeGRPC(gs)
	tcp, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on --addr %s: %w", cfg.Addr, err)
	}
	lis := newLimitListener(tcp, MaxConnections, log, svc.ConnClosed)
	var serving atomic.Bool
	setServing(hs, &serving, false)
	hsrv, err := p.serveHTTP(ctx, &serving, hs)
	if err != nil {
		lis.Close()
		return err
	}

	grpcErr := make(chan error, 1)
	go func() { grpcErr <- gs.Serve(lis) }()
	fctx, stopFlush := context.WithCancel(ctx)
	flushed := make(chan struct{})
	go func() { p.flushRejects(fctx); close(flushed) }()
	defer func() { stopFlush(); <-flushed }()
	var serveErr error
	if p.ha != nil {
		log.Info("serving CapacityProvider as a replica of an etcd state", "addr", lis.Addr().String(), "provider", cfg.Provider,
			"hypervisor", cfg.Hypervisor, "backend", cfg.Backend, "security", security, "identity", cfg.Etcd.Identity,
			"zones", strings.Join(cfg.Zones, ","))
		lctx, stop := context.WithCancel(ctx)
		leadDone := make(chan struct{})
		go func() { p.lead(lctx, hs, &serving); close(leadDone) }()
		select {
		case <-ctx.Done():
		case serveErr = <-grpcErr:
		}
		log.Info("shutting down")
		stop()
		<-leadDone
		hs.Shutdown()
	} else {
		t := p.current()
		t.start()
		setServing(hs, &serving, true)
		log.Info("serving CapacityProvider", "addr", lis.Addr().String(), "provider", cfg.Provider, "hypervisor", cfg.Hypervisor,
			"backend", cfg.Backend, "security", security, "machines", t.doc.Len(), "zones", strings.Join(cfg.Zones, ","))
		var lostErr error
		select {
		case <-ctx.Done():
		case serveErr = <-grpcErr:
		case lostErr = <-t.lost():
		}
		serving.Store(false)
		hs.Shutdown()
		if lostErr != nil {
			// Nothing this process does is recorded any more, and with the
			// lock gone another writer may have started: stop acting at
			// once and exit with the reason.
			log.Error("the state's files were removed or replaced under the running provider; stopping now, without finishing in-flight work (its intents were durable before; restore the files and start again)", "err", lostErr)
			t.abort("the state's files were removed under the running provider")
			serveErr = fmt.Errorf("stopped: %w", lostErr)
		} else {
			// A graceful stop: refuse new mutations (UNAVAILABLE) and
			// report NOT_SERVING, but keep answering reads while the
			// reconciler finishes the queued and in-flight work; only kill
			// -9 or an exhausted grace may interrupt a transition (and so
			// fail a Configure at the next start).
			log.Info("shutting down")
			t.drain(cfg.ShutdownGrace, "the provider is shutting down")
		}
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		gs.Stop()
	}
	if hsrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		hsrv.Shutdown(sctx)
		cancel()
	}
	return serveErr
}

// interceptors are the gRPC server's interceptor chains. The metrics
// interceptors sit outside the logging and recovery one, so a recovered
// panic is counted under the code it was turned into.
func (p *Provider) interceptors() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(p.Metrics.UnaryServerInterceptor(), p.unaryInterceptor),
		grpc.ChainStreamInterceptor(p.Metrics.StreamServerInterceptor()),
	}
}

// unaryInterceptor logs RPCs (debug when OK, warn otherwise, sampled per
// method and code: rejectlog.go), counts every rejection, and turns a
// handler panic into codes.Internal, so one bad request never takes the
// process down. Counting and timing all calls is the metrics
// interceptor's job.
func (p *Provider) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("panic in handler", "method", info.FullMethod, "panic", fmt.Sprint(r))
			err = status.Errorf(13, "internal error")
		}
		code := status.Code(err)
		level := slog.LevelDebug
		if code != 0 {
			p.Metrics.RPCRejected(info.FullMethod, code.String())
			admit, ended := p.rejects.admit(rejectKey{info.FullMethod, code.String()})
			logSuppressed(ctx, p.log, ended)
			if !admit {
				return
			}
			level = slog.LevelWarn
		}
		if !p.log.Enabled(ctx, level) {
			return // before the arguments are built (quoted and boxed) for nothing
		}
		p.log.Log(ctx, level, "rpc", "method", info.FullMethod, "machine", desired.Clip(machineOf(req), 64), "code", code.String(),
			"ms", float64(time.Since(start).Microseconds())/1000)
	}()
	return h(ctx, req)
}

func machineOf(req any) string {
	type idGetter interface{ GetMachineId() string }
	if g, ok := req.(idGetter); ok {
		return g.GetMachineId()
	}
	if r, ok := req.(*pb.MachineRef); ok {
		return r.GetId()
	}
	return ""
}

func serverTLS(t config.TLS) (*tls.Config, error) {
	cert, err := t.Keypair()
	if err != nil {
		return nil, err
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	if t.CA != "" {
		pool, err := t.ClientCAs()
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// certExpiry logs what start-up found about the certificates (close to
// expiry; the expired ones refused the start) and publishes the earliest
// expiry per role.
func certExpiry(cfg *config.Config, log *slog.Logger, m *metrics.Metrics) {
	for _, w := range cfg.CertWarnings(time.Now()) {
		log.Warn("certificate close to expiry", "detail", w, "threshold", config.CertExpiryWarning.String())
	}
	if len(cfg.Certs) == 0 {
		return
	}
	earliest := map[string]time.Time{}
	for _, c := range cfg.Certs {
		if t, ok := earliest[c.Role]; !ok || c.NotAfter.Before(t) {
			earliest[c.Role] = c.NotAfter
		}
	}
	m.CertificateExpiry(earliest, nil)
}
