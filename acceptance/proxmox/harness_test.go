package proxmox

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// binary is the provider built once by TestMain.
var binary string

func TestMain(m *testing.M) { os.Exit(buildAndRun(m)) }

func buildAndRun(m *testing.M) int {
	bin, cleanup, err := providertest.Build("provider-acceptance-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "acceptance:", err)
		return 1
	}
	defer cleanup()
	binary = bin
	return m.Run()
}

const (
	tokenID     = "bigfleet@pve!acceptance"
	templateID  = 9000
	poolName    = "fleet"
	pollTimeout = 60 * time.Second
)

// recGuest is the simulator's in-memory guest agent plus a record of every
// file write (the MemGuest forgets a file once the provider removes it).
type recGuest struct {
	*pvesim.MemGuest
	mu     sync.Mutex
	writes []fileWrite
}

type fileWrite struct {
	path string
	data []byte
}

func (g *recGuest) FileWrite(ctx context.Context, path string, data []byte) error {
	g.mu.Lock()
	g.writes = append(g.writes, fileWrite{path, append([]byte(nil), data...)})
	g.mu.Unlock()
	return g.MemGuest.FileWrite(ctx, path, data)
}

func (g *recGuest) Writes() []fileWrite {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]fileWrite(nil), g.writes...)
}

// cluster is one simulated Proxmox VE cluster (nodes pve1 and pve2, a
// template on pve1, pool "fleet") served over TLS on a loopback port with
// a certificate the test controls.
type cluster struct {
	t         testing.TB
	sim       *pvesim.Server
	url       string // https://127.0.0.1:P/api2/json
	fp        string // SHA-256 of the leaf certificate
	caFile    string // the certificate as a PEM CA bundle
	secret    string
	tokenFile string
	dir       string
}

type clusterOpts struct {
	latencies *pvesim.Latencies      // default: pvesim.ZeroLatency()
	acl       map[string][]string    // default: pvesim.FullAccess()
	setup     func(s *pvesim.Server) // before serving
	// storages are the cluster's storages besides local-lvm, and
	// templateStorage the one holding the template's disk (default
	// local-lvm).
	storages        []pvesim.Storage
	templateStorage string
}

func newCluster(t testing.TB, o clusterOpts) *cluster {
	t.Helper()
	lat := o.latencies
	if lat == nil {
		lat = pvesim.ZeroLatency()
	}
	acl := o.acl
	if acl == nil {
		acl = pvesim.FullAccess()
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, secret: "acc-" + hex.EncodeToString(b[:]), dir: t.TempDir()}
	// Nodes big enough for every test's Creates: the provider holds each
	// Create against its node's capacity (--capacity-check, default warn),
	// and these tests are about other things.
	c.sim = pvesim.New(pvesim.Options{Nodes: []string{"pve1", "pve2"}, Latencies: lat,
		Host:     pvesim.HostCapacity{MemoryBytes: 4 << 40, CPUs: 1024, StorageBytes: 1 << 40, StorageFreeBytes: 900 << 30},
		Storages: o.storages})
	c.sim.SetGuestFactory(func(int) pvesim.Guest { return &recGuest{MemGuest: pvesim.NewMemGuest()} })
	c.sim.AddToken(pvesim.Token{ID: tokenID, Secret: c.secret, ACL: acl})
	c.sim.AddPool(poolName)
	if err := c.sim.AddVM(pvesim.VMSpec{VMID: templateID, Node: "pve1", Name: "debian-12-tmpl", Template: true,
		Cores: 1, MemoryMiB: 1024, Tags: []string{"golden"}, Storage: o.templateStorage}); err != nil {
		t.Fatal(err)
	}
	if o.setup != nil {
		o.setup(c.sim)
	}
	cert, pemBytes, fp, err := pvesim.SelfSignedPEM([]string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	c.fp = fp
	c.caFile = c.write("pve-root-ca.pem", pemBytes)
	c.tokenFile = c.write("token", []byte(c.secret+"\n"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           c.sim.Handler(),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){}, // HTTP/1.1: reason phrases carry errors
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // refused handshakes are expected
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close(); c.sim.Close() })
	c.url = "https://" + ln.Addr().String() + "/api2/json"
	return c
}

func (c *cluster) write(name string, b []byte) string {
	c.t.Helper()
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// guest returns the recording guest agent of a VM.
func (c *cluster) guest(vmid int) *recGuest {
	c.t.Helper()
	g, ok := c.sim.GuestOf(vmid).(*recGuest)
	if !ok {
		c.t.Fatalf("vm %d has no recording guest", vmid)
	}
	return g
}

// clones lists the VMIDs of every non-template VM.
func (c *cluster) clones() []int {
	var out []int
	for _, id := range c.sim.VMIDs() {
		if v, ok := c.sim.VM(id); ok && !v.Template {
			out = append(out, id)
		}
	}
	return out
}

// offering is one line of an offerings file.
type offering struct {
	InstanceType string `json:"instance_type"`
	Zone         string `json:"zone"`
	CapacityType string `json:"capacity_type"`
	Count        int    `json:"count"`
}

// trust selects how the binary verifies the simulator's certificate.
type trust int

const (
	pinFingerprint trust = iota
	caFile
)

func (tr trust) String() string { return [...]string{"fingerprint", "ca-file"}[tr] }

// launch describes one provider process.
type launch struct {
	trust     trust
	offerings []offering // default: 4 pve.small on pve1, 2 on pve2
	state     string     // default: a fresh file in the test's temp dir
	args      []string   // extra flags; they come last, so they win
}

var installSeq atomic.Int64

// provider is the provider run against a cluster, plus its stable client.
type provider struct {
	*providertest.Provider
	t   testing.TB
	c   *cluster
	api pb.CapacityProviderClient
}

// flags returns the argv for l against c (the harness adds the ports).
func (c *cluster) flags(t testing.TB, l launch) []string {
	t.Helper()
	offs := l.offerings
	if offs == nil {
		offs = []offering{{"pve.small", "pve1", "on_demand", 4}, {"pve.small", "pve2", "on_demand", 2}}
	}
	b, err := json.Marshal(offs)
	if err != nil {
		t.Fatal(err)
	}
	offFile := filepath.Join(t.TempDir(), "offerings.json")
	if err := os.WriteFile(offFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	state := l.state
	if state == "" {
		state = filepath.Join(t.TempDir(), "provider.state")
	}
	argv := []string{"serve",
		"--proxmox-api-url", c.url,
		"--proxmox-token-id", tokenID,
		"--proxmox-token-file", c.tokenFile,
		"--proxmox-pool", poolName,
		"--nodes", "pve1,pve2",
		"--template-vmid", fmt.Sprint(templateID),
		"--offerings", offFile,
		"--state", state,
		"--installation-id", fmt.Sprintf("acc-%d-%d", os.Getpid(), installSeq.Add(1)),
		"--reconcile-interval", "1s",
		"--create-timeout", "60s",
		"--configure-timeout", "30s",
		"--drain-timeout", "30s",
		"--delete-timeout", "30s",
		"--log-level", "debug",
	}
	switch l.trust {
	case pinFingerprint:
		argv = append(argv, "--proxmox-tls-fingerprint", c.fp)
	case caFile:
		argv = append(argv, "--proxmox-ca-file", c.caFile)
	}
	return append(argv, l.args...)
}

// start launches the provider against c and waits until it is ready.
func (c *cluster) start(t testing.TB, l launch) *provider {
	t.Helper()
	p := &provider{t: t, c: c, Provider: providertest.Start(t, binary, providertest.Options{Args: c.flags(t, l)})}
	p.api = p.Client()
	t.Cleanup(func() {
		p.Kill()
		if strings.Contains(p.Log(), c.secret) {
			t.Errorf("the token secret appears in the provider's output")
		}
		if t.Failed() {
			t.Logf("provider output:\n%s", p.Log())
		}
	})
	return p
}

// runExit runs the binary expecting it to exit on its own (startup
// refusal) and returns its output and exit code.
func runExit(t testing.TB, argv []string) (string, int) {
	t.Helper()
	addrs := providertest.FreeAddrs(t, 2) // both held open while picked: never one port twice
	argv = append(append([]string(nil), argv...), "--addr", addrs[0], "--metrics-addr", addrs[1])
	return providertest.Run(t, binary, 60*time.Second, argv...)
}

// rpcCtx is a per-call context.
func rpcCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (p *provider) get(id string) *pb.Machine {
	p.t.Helper()
	return providertest.Get(p.t, p.api, id)
}

// machines returns the ids of the SPECULATIVE machines in zone.
func (p *provider) machines(zone string) []string {
	p.t.Helper()
	l, err := p.api.List(rpcCtx(p.t), &pb.ListFilter{States: []pb.MachineState{providertest.StSpeculative}})
	if err != nil {
		p.t.Fatalf("List: %v", err)
	}
	var ids []string
	for _, m := range l.Machines {
		if m.Zone == zone {
			ids = append(ids, m.Id)
		}
	}
	return ids
}

// wait polls Get until the machine is in want; FAILED (unless wanted) is
// fatal, with last_error.
func (p *provider) wait(id string, want pb.MachineState) *pb.Machine {
	p.t.Helper()
	return providertest.WaitState(p.t, p.api, id, want, pollTimeout)
}

func (p *provider) create(id string) {
	p.t.Helper()
	if _, err := p.api.Create(rpcCtx(p.t), &pb.CreateRequest{MachineId: id}); err != nil {
		p.t.Fatalf("Create %s: %v", id, err)
	}
}

func (p *provider) configure(id, cluster string, blob []byte) {
	p.t.Helper()
	if _, err := p.api.Configure(rpcCtx(p.t), &pb.ConfigureRequest{MachineId: id, ClusterId: cluster, BootstrapBlob: blob}); err != nil {
		p.t.Fatalf("Configure %s: %v", id, err)
	}
}

func (p *provider) drain(id string, grace int64) {
	p.t.Helper()
	if _, err := p.api.Drain(rpcCtx(p.t), &pb.DrainRequest{MachineId: id, GracePeriodSeconds: grace}); err != nil {
		p.t.Fatalf("Drain %s: %v", id, err)
	}
}

func (p *provider) delete(id string) {
	p.t.Helper()
	if _, err := p.api.Delete(rpcCtx(p.t), &pb.DeleteRequest{MachineId: id}); err != nil {
		p.t.Fatalf("Delete %s: %v", id, err)
	}
}

// toIdle creates a machine, waits for IDLE and returns its VMID.
func (p *provider) toIdle(id string) int {
	p.t.Helper()
	p.create(id)
	return vmidOf(p.t, p.wait(id, providertest.StIdle))
}

// vmidOf parses the "<node>/<vmid>" host ref of a machine.
func vmidOf(t testing.TB, m *pb.Machine) int {
	t.Helper()
	ref := m.GetHost().GetRef()
	var node string
	var vmid int
	if i := strings.LastIndexByte(ref, '/'); i < 0 {
		t.Fatalf("machine %s: host ref %q is not <node>/<vmid>", m.Id, ref)
	} else {
		node = ref[:i]
		if _, err := fmt.Sscanf(ref[i+1:], "%d", &vmid); err != nil || node != m.Zone {
			t.Fatalf("machine %s in %s: host ref %q is not %s/<vmid>", m.Id, m.Zone, ref, m.Zone)
		}
	}
	return vmid
}

// eventually polls cond until it holds or the poll timeout passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(pollTimeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
