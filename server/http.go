package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
	"github.com/bigfleet-vm/provider/reconciler"
)

// MetricsHealthService is the gRPC health service name that reports the
// metrics listener: SERVING while it listens, NOT_SERVING when it could
// not be bound (the provider then serves gRPC without it). It is not
// registered when the listener is disabled (--metrics-addr ""), so a
// check answers NOT_FOUND. The overall status ("") is about gRPC only.
const MetricsHealthService = "metrics-listener"

// Bounds of /debug/plan.
const (
	// defaultPlanMaxAge is how old a plan /debug/plan may serve without
	// observing again, when the request does not say (?max_age=).
	defaultPlanMaxAge = 2 * time.Second
	maxPlanMaxAge     = time.Hour
	// minPlanMaxAge is the youngest plan a caller may demand: a smaller
	// max_age is raised to it (X-Plan-Max-Age says so), so no caller can
	// make the provider observe every host more often than this. With the
	// admin endpoints on (--fake-admin, the simulator only) any max_age
	// down to 0 is honoured.
	minPlanMaxAge = defaultPlanMaxAge
	// planTimeout bounds one observation of every host for /debug/plan.
	planTimeout = 60 * time.Second
)

// serveHTTP starts the metrics listener. A default --metrics-addr that
// cannot be bound is logged and reported on MetricsHealthService, and the
// provider serves on without it (several providers on one host all
// default to :9090); an explicitly given one fails the start.
func (p *Provider) serveHTTP(ctx context.Context, serving *atomic.Bool, hs *health.Server) (*http.Server, error) {
	cfg := p.cfg
	if cfg.MetricsAddr == "" {
		return nil, nil
	}
	var tc *tls.Config
	if cfg.MetricsTLS {
		cert, err := cfg.TLS.Keypair()
		if err != nil {
			return nil, fmt.Errorf("--metrics-tls: %w", err)
		}
		tc = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}
	hl, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		if cfg.MetricsAddrExplicit {
			return nil, fmt.Errorf("listen on --metrics-addr %s: %w", cfg.MetricsAddr, err)
		}
		hs.SetServingStatus(MetricsHealthService, healthpb.HealthCheckResponse_NOT_SERVING)
		p.log.Error("metrics listener is off: the default --metrics-addr cannot be bound; gRPC serves without /metrics, /healthz, /readyz and /debug/plan (pass --metrics-addr to choose a free address, or an empty one to disable it)",
			"addr", cfg.MetricsAddr, "err", err, "health_service", MetricsHealthService)
		return nil, nil
	}
	scheme := "http"
	if tc != nil {
		hl = tls.NewListener(hl, tc)
		scheme = "https"
	}
	p.plans = newPlanCache(ctx, func(ctx context.Context) (*jsonplan.Plan, error) {
		t := p.current()
		if t == nil {
			return nil, errors.New("this replica is not serving the desired state")
		}
		plan := t.rec.Plan(ctx).JSON()
		plan.Capacity = t.capacitySection()
		return plan, nil
	})
	hsrv := &http.Server{Handler: p.httpHandler(serving), ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)}
	go hsrv.Serve(hl)
	hs.SetServingStatus(MetricsHealthService, healthpb.HealthCheckResponse_SERVING)
	p.log.Info("metrics listening", "addr", scheme+"://"+hl.Addr().String(), "admin", p.adminEnabled())
	return hsrv, nil
}

// adminEnabled reports whether the /admin/ endpoints serve: only on the
// simulator, and only when --fake-admin asks for them.
func (p *Provider) adminEnabled() bool {
	return p.cfg.Backend == config.BackendFake && p.cfg.Fake.Admin
}

// httpHandler serves /metrics, /healthz, /readyz, /debug/plan,
// /debug/repairs and, on the
// simulator with --fake-admin, the /admin/ drift endpoints.
func (p *Provider) httpHandler(serving *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(p.Metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		var problems []string
		if !serving.Load() {
			problems = append(problems, "gRPC is not serving")
		}
		t := p.current()
		switch {
		case t == nil:
			msg := "this replica is not serving the desired state"
			if p.ha != nil {
				if tr := p.ha.trouble.Load(); tr != nil {
					msg += ": " + tr.String()
				}
			}
			problems = append(problems, msg)
			if p.ha != nil {
				if err := p.ha.follow.health(); err != nil {
					problems = append(problems, "standby: "+err.Error())
				}
			}
		default:
			if err := t.doc.Healthy(); err != nil {
				problems = append(problems, "state store: "+err.Error())
			}
		}
		var detail []string
		if zh := p.zoneHealth(); zh != nil {
			zones := make([]string, 0, len(zh))
			for z := range zh {
				zones = append(zones, z)
			}
			sort.Strings(zones)
			for _, z := range zones {
				if err := zh[z]; err != nil {
					detail = append(detail, "zone "+z+": "+err.Error())
				} else {
					detail = append(detail, "zone "+z+": ok")
				}
			}
		}
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready")
			for _, s := range problems {
				fmt.Fprintln(w, s)
			}
		} else {
			fmt.Fprintln(w, "ready")
		}
		for _, s := range detail {
			fmt.Fprintln(w, s)
		}
	})
	mux.HandleFunc("/debug/plan", p.debugPlan)
	mux.HandleFunc("/debug/repairs", p.debugRepairs)
	mux.HandleFunc("/debug/history", p.debugHistory)
	switch {
	case p.adminEnabled():
		mux.HandleFunc("/admin/", p.admin)
	case p.cfg.Backend == config.BackendFake:
		mux.HandleFunc("/admin/", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "the admin endpoints are off: start the simulator with --fake-admin to serve them", http.StatusNotFound)
		})
	}
	return mux
}

// debugPlan serves the JSON plan: the newest one if it is at most
// ?max_age= old (default defaultPlanMaxAge, at least minPlanMaxAge unless
// the admin endpoints are on), else a fresh observation shared with every
// request that waits for one meanwhile. The Age header says how old the
// served plan is, in seconds; X-Plan-Max-Age the max_age applied.
func (p *Provider) debugPlan(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	maxAge := defaultPlanMaxAge
	if v := r.URL.Query().Get("max_age"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > maxPlanMaxAge {
			http.Error(w, fmt.Sprintf("max_age must be a duration between 0s and %s, e.g. 30s", maxPlanMaxAge), http.StatusBadRequest)
			return
		}
		maxAge = d
	}
	if maxAge < minPlanMaxAge && !p.adminEnabled() {
		maxAge = minPlanMaxAge
	}
	w.Header().Set("X-Plan-Max-Age", maxAge.String())
	body, at, err := p.plans.get(r.Context(), maxAge)
	if err != nil {
		http.Error(w, "plan: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Age", strconv.Itoa(int(time.Since(at).Seconds())))
	w.Write(body)
}

// maxRepairsListed bounds the machines /debug/repairs lists.
const maxRepairsListed = 1000

// debugRepairs serves the machines whose newest drift repair failed, each
// with its last error, how many runs failed in a row and the backoff
// before the next (reconciler.RepairFailure), as JSON: {"total": N,
// "machines": [...]} with at most maxRepairsListed machines.
func (p *Provider) debugRepairs(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	t := p.current()
	if t == nil {
		http.Error(w, "this replica is not serving the desired state", http.StatusServiceUnavailable)
		return
	}
	all := t.rec.RepairFailures()
	out := struct {
		Total    int                        `json:"total"`
		Machines []reconciler.RepairFailure `json:"machines"`
	}{Total: len(all), Machines: all[:min(len(all), maxRepairsListed)]}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(out)
}

// planCache computes plans for /debug/plan. At most one computation runs
// at a time; requests that find one running wait for it rather than
// observing every host again. Its result is reused while young enough
// and dropped when the simulated world is changed through /admin/.
type planCache struct {
	ctx     context.Context // bounds computations: the listener's lifetime
	compute func(context.Context) (*jsonplan.Plan, error)

	mu       sync.Mutex
	body     []byte    // the newest encoded plan, nil after invalidate
	at       time.Time // when its observation started
	gen      uint64    // bumped by invalidate
	inflight *planCall
}

type planCall struct {
	done chan struct{}
	gen  uint64
	body []byte
	at   time.Time
	err  error
}

// planClock is the plan cache's clock; tests stop it.
var planClock = time.Now

func newPlanCache(ctx context.Context, compute func(context.Context) (*jsonplan.Plan, error)) *planCache {
	return &planCache{ctx: ctx, compute: compute}
}

// get returns an encoded plan no older than maxAge, or the one being
// computed for a request that came before.
func (c *planCache) get(ctx context.Context, maxAge time.Duration) ([]byte, time.Time, error) {
	c.mu.Lock()
	if c.body != nil && planClock().Sub(c.at) <= maxAge {
		body, at := c.body, c.at
		c.mu.Unlock()
		return body, at, nil
	}
	call := c.inflight
	if call == nil {
		call = &planCall{done: make(chan struct{}), gen: c.gen}
		c.inflight = call
		go c.run(call)
	}
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.body, call.at, call.err
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	}
}

func (c *planCache) run(call *planCall) {
	ctx, cancel := context.WithTimeout(c.ctx, planTimeout)
	defer cancel()
	at := planClock()
	var body []byte
	plan, err := c.compute(ctx)
	if err == nil {
		body, err = jsonplan.Marshal(plan)
	}
	c.mu.Lock()
	call.body, call.at, call.err = body, at, err
	if err == nil && call.gen == c.gen {
		c.body, c.at = body, at
	}
	if c.inflight == call {
		c.inflight = nil
	}
	c.mu.Unlock()
	close(call.done)
}

// invalidate forgets the newest plan and detaches a running computation,
// so the next request observes the world as it is now.
func (c *planCache) invalidate() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.body = nil
	c.gen++
	c.inflight = nil
	c.mu.Unlock()
}

// admin serves POST /admin/{stop,pause,resize,delete,add-foreign,add-owned,unreachable,flaky}
// and GET /admin/guest on the current term's simulator (the
// hypervisors.Simulator capability). VMs are named by zone plus name or
// vmid, as the simulator names them, or by machine.
func (p *Provider) admin(w http.ResponseWriter, r *http.Request) {
	action := strings.TrimPrefix(r.URL.Path, "/admin/")
	if r.Method != http.MethodPost && !(r.Method == http.MethodGet && action == "guest") {
		http.Error(w, "use POST (GET for /admin/guest)", http.StatusMethodNotAllowed)
		return
	}
	tm := p.current()
	if tm == nil {
		http.Error(w, "this replica is not serving the desired state", http.StatusServiceUnavailable)
		return
	}
	sim := hypervisors.CapabilitiesOf(tm.raw).Simulator
	if sim == nil {
		http.Error(w, "the admin endpoints drive the simulator only", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	t := hypervisors.Target{Zone: q.Get("zone"), Name: q.Get("name")}
	// Numbers must be numbers (a typo is not a zero); what they and the
	// names mean is checked by the simulator with the wire's rules.
	ints := map[string]int{}
	for _, k := range []string{"vmid", "vcpu", "memory_mib"} {
		if v := q.Get(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				http.Error(w, fmt.Sprintf("%s %s is not an integer", k, desired.Clip(v, 64)), http.StatusBadRequest)
				return
			}
			ints[k] = n
		}
	}
	t.VMID = ints["vmid"]
	if m := q.Get("machine"); m != "" {
		if err := desired.CheckID("machine", m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mm := tm.doc.Get(m)
		switch {
		case mm == nil:
			http.Error(w, "unknown machine "+bounded(m, 128), http.StatusNotFound)
			return
		case mm.VMName == "" || mm.State == desired.Speculative:
			http.Error(w, "machine "+bounded(m, 128)+" is "+mm.State.String()+" and has no VM yet; Create it first", http.StatusConflict)
			return
		}
		t = hypervisors.Target{Zone: mm.Zone, Name: mm.VMName, VMID: mm.VMID}
	}
	var err error
	switch action {
	case "guest":
		g, ok := sim.SimGuest(t)
		if !ok {
			http.Error(w, "no such VM", http.StatusNotFound)
			return
		}
		// Show only what is durable: everything read was journaled before
		// this flush.
		if err := durable(r.Context(), tm.store); err != nil {
			http.Error(w, "state store: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(g)
		return
	case "stop":
		err = sim.StopVM(t)
	case "pause":
		err = sim.PauseVM(t)
	case "resize":
		err = sim.ResizeVM(t, ints["vcpu"], ints["memory_mib"])
	case "delete":
		err = sim.RemoveVM(t)
	case "add-foreign":
		err = sim.AddForeign(t)
	case "add-owned":
		err = sim.AddOwned(t, observed.Marker{Installation: tm.doc.Installation(), MachineID: q.Get("id"), InstanceType: q.Get("instance_type")})
	case "unreachable":
		sim.SetUnreachable(t.Zone, q.Get("on") != "false")
	case "flaky":
		err = sim.SetFlaky(t.Zone, q.Get("op"), q.Get("on") != "false")
	default:
		http.Error(w, "unknown admin action "+bounded(action, 64), http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The simulator journals its world without waiting: answer once the
	// change is durable, as a hypervisor's own API would.
	if err := durable(r.Context(), tm.store); err != nil {
		http.Error(w, "the change is made but not known to be durable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	p.plans.invalidate()
	tm.rec.Trigger()
	fmt.Fprintln(w, "ok")
}

// durable returns once everything committed to store so far is durable.
func durable(ctx context.Context, store stateStore) error {
	done := make(chan error, 1)
	store.Commit(nil, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// bounded cuts s to n bytes for a message.
func bounded(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// FetchOptions configure FetchPlan.
type FetchOptions struct {
	// CAFile is a PEM bundle that verifies an https:// listener's
	// certificate instead of the system roots.
	CAFile string
}

// maxPlanBytes bounds a fetched plan.
const maxPlanBytes = 256 << 20

// FetchPlan gets the plan of a running provider from its metrics
// listener's /debug/plan (base is e.g. http://127.0.0.1:9090, or https://
// with --metrics-tls). It returns the decoded plan and the JSON exactly as
// served, which Decode has checked is a plan this build can read.
func FetchPlan(ctx context.Context, base string, o FetchOptions) (*jsonplan.Plan, []byte, error) {
	url := strings.TrimRight(base, "/") + "/debug/plan"
	if !strings.Contains(base, "://") {
		url = "http://" + url
	}
	client := http.DefaultClient
	if o.CAFile != "" {
		pemBytes, err := conffile.Read(o.CAFile, conffile.MaxPEMBytes)
		if err != nil {
			return nil, nil, fmt.Errorf("fetch plan: CA bundle: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemBytes) {
			return nil, nil, fmt.Errorf("fetch plan: CA bundle %s: no PEM certificate found", o.CAFile)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
		client = &http.Client{Transport: tr}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch plan: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch plan from %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPlanBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("fetch plan from %s: %w", url, err)
	}
	if len(body) > maxPlanBytes {
		return nil, nil, fmt.Errorf("fetch plan from %s: the plan is larger than %d MiB", url, maxPlanBytes>>20)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("fetch plan from %s: %s: %s", url, resp.Status, bounded(strings.TrimSpace(string(body)), 512))
	}
	p, err := jsonplan.Decode(body)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch plan from %s: %w", url, err)
	}
	return p, body, nil
}
