package proxmox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

const (
	testToken  = "bigfleet@pve!ci"
	testSecret = "5e1c7c1e-0000-4000-8000-00000000beef"
	testInst   = "prod-eu"
	template   = 9000
)

type env struct {
	sim *pvesim.Server
	srv *httptest.Server
	a   *Adapter
	cfg Config
	fp  string
	ca  string
}

// newEnv starts a simulator over TLS with nodes pve1..pve3, a template on
// pve1, pool "fleet" and a full-access token, and an adapter pinned to the
// server's fingerprint. opts and mut adjust the simulator and the config.
// The poller is off (PollInterval -1) unless mut turns it on: the tests of
// operations count and number the requests they cause, and a poll in
// between would shift them (poll_test.go tests the poller).
func newEnv(t testing.TB, opts *pvesim.Options, mut func(*Config)) *env {
	t.Helper()
	o := pvesim.Options{Nodes: []string{"pve1", "pve2", "pve3"}, Latencies: pvesim.ZeroLatency()}
	if opts != nil {
		o = *opts
	}
	sim := pvesim.New(o)
	sim.AddToken(pvesim.Token{ID: testToken, Secret: testSecret, ACL: pvesim.FullAccess()})
	sim.AddPool("fleet")
	if err := sim.AddVM(pvesim.VMSpec{VMID: template, Node: "pve1", Name: "debian-12-tmpl", Template: true, Cores: 1, MemoryMiB: 1024, Tags: []string{"golden"}}); err != nil {
		t.Fatal(err)
	}
	srv := sim.NewTLSServer()
	t.Cleanup(func() { srv.Close(); sim.Close() })
	sum := sha256.Sum256(srv.Certificate().Raw)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		APIURL: srv.URL + "/api2/json", TokenID: testToken, TokenSecret: testSecret,
		Fingerprint: hex.EncodeToString(sum[:]), Pool: "fleet", Nodes: []string{"pve1", "pve2", "pve3"},
		Installation: testInst, PollMin: 5 * time.Millisecond, PollMax: 50 * time.Millisecond,
		PollInterval: -1,
	}
	if mut != nil {
		mut(&cfg)
	}
	e := &env{sim: sim, srv: srv, cfg: cfg, fp: hex.EncodeToString(sum[:]), ca: ca}
	if cfg.APIURL != "" {
		a, err := New(cfg, nil)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		e.a = a
		t.Cleanup(func() { a.Close() })
	}
	return e
}

func marker(machine string) observed.Marker {
	return observed.Marker{Installation: testInst, MachineID: machine, OpID: "op-1", InstanceType: "pve.small"}
}

func cloneSpec(machine string) pvespec.CloneSpec {
	return pvespec.CloneSpec{Name: naming.VMName(testInst, machine, 1), TemplateVMID: template, Marker: marker(machine)}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitAgent polls AgentPing until the agent answers, as the executor would.
func waitAgent(ctx context.Context, a *Adapter, tg hypervisors.Target) (notReady int, err error) {
	for {
		err := a.AgentPing(ctx, tg)
		if err == nil {
			return notReady, nil
		}
		if !errors.Is(err, hypervisors.ErrAgentNotReady) {
			return notReady, err
		}
		notReady++
		select {
		case <-ctx.Done():
			return notReady, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func osWriteFile(p string, b []byte) error { return os.WriteFile(p, b, 0o600) }

// The adapter logs with the logger it is given and adds no keys of its
// own: the server already names the hypervisor, and "hypervisor=proxmox"
// appeared twice per JSON line (duplicate keys, issue 9).
func TestAdapterAddsNoLogKeys(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.APIURL = "" })
	var buf bytes.Buffer
	a, err := New(func() Config { c := e.cfg; c.APIURL = e.srv.URL + "/api2/json"; return c }(),
		slog.New(slog.NewJSONHandler(&buf, nil)).With("hypervisor", "proxmox"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.log.Info("probe")
	if n := strings.Count(buf.String(), `"hypervisor"`); n != 1 {
		t.Errorf("a log line carries the hypervisor key %d times: %s", n, buf.String())
	}
}
