package providertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// Options describe a provider the harness runs.
type Options struct {
	// Env are extra environment variables (KEY=value) for the provider,
	// after the test's own environment (a later one wins): a test binary
	// that is the provider when a variable says so (a hypervisor that
	// exists only in its tests).
	Env []string
	// Args are the arguments from the subcommand on ("serve", ...). The
	// harness appends --addr and --metrics-addr with fresh loopback
	// ports at every launch, so Args must not set them.
	Args []string
	// LogFile, when set, is the file every launch's output is appended
	// to; otherwise the output is kept in memory.
	LogFile string
	// Dial are options for the gRPC client after insecure transport
	// credentials (a later option wins: pass TLS credentials here).
	Dial []grpc.DialOption
	// ReadyTimeout bounds the wait for /readyz (or WaitPath) at each
	// launch; default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// WaitPath is the metrics-listener path each launch waits to answer
	// 200 before it counts as started; empty means /readyz. A replica of
	// an etcd state that stands by is never ready, only alive: such a
	// launch waits for /healthz.
	WaitPath string
	// Detached leaves the provider running when the test ends: the
	// caller kills it (a process shared by a package's benchmarks).
	Detached bool
}

// DefaultReadyTimeout is the wait for /readyz when Options.ReadyTimeout
// is zero.
const DefaultReadyTimeout = 2 * time.Minute

// launchAttempts is how often a launch is tried when a port it was given
// was taken in the meantime.
const launchAttempts = 3

// Provider is the provider binary run as a server: one process at a time
// (the embedded Process, replaced by every Launch), on loopback ports of
// the harness's choosing, plus a gRPC client that follows it across
// launches.
type Provider struct {
	*Process

	t      testing.TB
	binary string
	opts   Options
	args   []string
	out    output
	addr   string
	maddr  string
	ready  time.Duration

	mu   sync.Mutex
	conn *grpc.ClientConn // to the current process; nil when none runs

	client pb.CapacityProviderClient
}

// Start launches binary with o.Args (see Launch) and, unless o.Detached,
// kills it when the test ends.
func Start(t testing.TB, binary string, o Options) *Provider {
	t.Helper()
	p := &Provider{t: t, binary: binary, opts: o, args: append([]string(nil), o.Args...)}
	if o.LogFile != "" {
		p.out = &fileOutput{path: o.LogFile}
	} else {
		p.out = &memOutput{}
	}
	if p.opts.ReadyTimeout == 0 {
		p.opts.ReadyTimeout = DefaultReadyTimeout
	}
	p.client = pb.NewCapacityProviderClient(current{p})
	if !o.Detached {
		t.Cleanup(p.Kill)
	}
	p.Launch()
	return p
}

// Launch starts a new process with the same arguments and output on
// fresh loopback ports (retrying when a port was taken), waits until
// /readyz (or Options.WaitPath) answers 200 and connects the client. A process still running
// is killed first. It fails the test when the provider does not become
// ready.
func (p *Provider) Launch() {
	p.t.Helper()
	if p.Process != nil {
		p.Kill()
	}
	var lastErr error
	for range launchAttempts {
		ports := FreeAddrs(p.t, 2)
		addr, maddr := ports[0], ports[1]
		argv := append(append([]string(nil), p.args...), "--addr", addr, "--metrics-addr", maddr)
		began := time.Now()
		proc, err := startProcess(p.t, p.binary, argv, p.opts.Env, p.out)
		if err != nil {
			p.t.Fatal(err)
		}
		p.Process, p.addr, p.maddr = proc, addr, maddr
		err = WaitHTTP(maddr, p.opts.WaitPath, proc.Done(), p.opts.ReadyTimeout)
		if err == nil {
			p.ready = time.Since(began)
			p.connect()
			return
		}
		if errors.Is(err, ErrExited) {
			err = fmt.Errorf("exited: %v", proc.Err())
		}
		proc.Kill()
		if strings.Contains(proc.Output(), "address already in use") {
			lastErr = err
			continue
		}
		p.t.Fatalf("%s did not become ready: %v\noutput:\n%s", describe(argv), err, tail(proc.Output()))
	}
	p.t.Fatalf("provider never started, its ports were taken %d times: %v", launchAttempts, lastErr)
}

func (p *Provider) connect() {
	p.t.Helper()
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, p.opts.Dial...)
	conn, err := grpc.NewClient(p.addr, opts...)
	if err != nil {
		p.Process.Kill()
		p.t.Fatalf("gRPC client for %s: %v", p.addr, err)
	}
	p.mu.Lock()
	p.conn = conn
	p.mu.Unlock()
}

func (p *Provider) disconnect() {
	p.mu.Lock()
	conn := p.conn
	p.conn = nil
	p.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// Kill closes the client's connection, sends SIGKILL, reaps the process
// and checks its output for races (Process.Kill).
func (p *Provider) Kill() {
	p.t.Helper()
	p.disconnect()
	if p.Process != nil {
		p.Process.Kill()
	}
}

// Terminate closes the client's connection and stops the process with
// SIGTERM (Process.Terminate); it returns the exit code.
func (p *Provider) Terminate() int {
	p.t.Helper()
	p.disconnect()
	return p.Process.Terminate()
}

// Restart kills the process (SIGKILL: a crash) and launches it again with
// the same arguments, so the same state file and installation, on new
// ports.
func (p *Provider) Restart() {
	p.t.Helper()
	p.Kill()
	p.Launch()
}

// AppendArgs adds arguments for the next launches; they come after the
// earlier ones, so they win.
func (p *Provider) AppendArgs(args ...string) { p.args = append(p.args, args...) }

// Argv is the full argument list of the current process, ports included.
func (p *Provider) Argv() []string { return append([]string(nil), p.Process.argv...) }

// Bind makes t the test the provider reports to and registers later
// connections' cleanup with (for a Detached provider shared by tests).
func (p *Provider) Bind(t testing.TB) {
	p.t = t
	if p.Process != nil {
		p.Process.t = t
	}
}

// T is the test the provider reports to.
func (p *Provider) T() testing.TB { return p.t }

// Addr is the gRPC listen address of the current process.
func (p *Provider) Addr() string { return p.addr }

// MetricsAddr is the metrics listener's address of the current process.
func (p *Provider) MetricsAddr() string { return p.maddr }

// MetricsURL is http://MetricsAddr.
func (p *Provider) MetricsURL() string { return "http://" + p.maddr }

// TimeToReady is how long the current process took from exec to its
// first /readyz (or Options.WaitPath) 200.
func (p *Provider) TimeToReady() time.Duration { return p.ready }

// Log is the output of every launch so far, each after its header line.
func (p *Provider) Log() string { return p.out.text() }

// Client is a gRPC client of the current process; it stays valid across
// launches. Between a Kill and the next Launch its calls fail with
// Unavailable.
func (p *Provider) Client() pb.CapacityProviderClient { return p.client }

// Conn is the connection behind Client, for raw calls (Invoke with a
// codec of the caller's).
func (p *Provider) Conn() grpc.ClientConnInterface { return current{p} }

// Dial opens an extra connection of its own to the current process,
// closed when the test ends, and returns a client on it.
func (p *Provider) Dial() pb.CapacityProviderClient {
	p.t.Helper()
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, p.opts.Dial...)
	conn, err := grpc.NewClient(p.addr, opts...)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { conn.Close() })
	return pb.NewCapacityProviderClient(conn)
}

// httpTimeout bounds HTTPGet.
const httpTimeout = 90 * time.Second

// HTTPGet fetches path from the metrics listener and returns the status
// code and body; a transport error fails the test.
func (p *Provider) HTTPGet(path string) (int, string) {
	p.t.Helper()
	hc := &http.Client{Timeout: httpTimeout}
	resp, err := hc.Get(p.MetricsURL() + path)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		p.t.Fatalf("GET %s: read body: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// HTTPPost posts an empty body to path on the metrics listener and
// returns the status code and body; a transport error fails the test.
func (p *Provider) HTTPPost(path string) (int, string) {
	p.t.Helper()
	hc := &http.Client{Timeout: httpTimeout}
	resp, err := hc.Post(p.MetricsURL()+path, "text/plain", nil)
	if err != nil {
		p.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		p.t.Fatalf("POST %s: read body: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// Admin posts to /admin/query (the simulator's admin endpoints, served
// with --fake-admin: "stop?machine=ID", "unreachable?zone=Z&on=true",
// ...) and fails the test unless it answers "ok".
func (p *Provider) Admin(query string) {
	p.t.Helper()
	code, body := p.HTTPPost("/admin/" + query)
	if code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		p.t.Fatalf("admin %s: %d %s", query, code, body)
	}
}

// current is a connection that forwards to the provider's current
// process.
type current struct{ p *Provider }

var errNotRunning = status.Error(codes.Unavailable, "providertest: the provider is not running (killed, not launched again)")

func (c current) get() *grpc.ClientConn {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.p.conn
}

func (c current) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	conn := c.get()
	if conn == nil {
		return errNotRunning
	}
	return conn.Invoke(ctx, method, args, reply, opts...)
}

func (c current) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	conn := c.get()
	if conn == nil {
		return nil, errNotRunning
	}
	return conn.NewStream(ctx, desc, method, opts...)
}
