//go:build integration

package libvirt

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/internal/relay"
)

// transports is what scripts/libvirt-up.sh and sshd-up.sh set up: this
// machine's libvirtd reached over qemu+tls (client certificates required)
// and through two sshd daemons as qemu+libssh and qemu+ssh.
type transports struct {
	tlsDir, tlsPort                      string
	sshUser, sshKey                      string
	knownHosts, knownEmpty, knownChanged string
	libsshPort, libsshConf, libsshPID    string
	sshPort, sshConf, sshPID             string
}

func needTransports(t *testing.T) transports {
	t.Helper()
	tr := transports{
		tlsDir: os.Getenv("BIGFLEET_TLS_DIR"), tlsPort: os.Getenv("BIGFLEET_TLS_PORT"),
		sshUser: os.Getenv("BIGFLEET_SSH_USER"), sshKey: os.Getenv("BIGFLEET_SSH_KEY"),
		knownHosts: os.Getenv("BIGFLEET_SSH_KNOWN_HOSTS"), knownEmpty: os.Getenv("BIGFLEET_SSH_KNOWN_HOSTS_EMPTY"),
		knownChanged: os.Getenv("BIGFLEET_SSH_KNOWN_HOSTS_CHANGED"),
		libsshPort:   os.Getenv("BIGFLEET_SSHD_LIBSSH_PORT"), libsshConf: os.Getenv("BIGFLEET_SSHD_LIBSSH_CONF"),
		libsshPID: os.Getenv("BIGFLEET_SSHD_LIBSSH_PID"),
		sshPort:   os.Getenv("BIGFLEET_SSHD_SSH_PORT"), sshConf: os.Getenv("BIGFLEET_SSHD_SSH_CONF"), sshPID: os.Getenv("BIGFLEET_SSHD_SSH_PID"),
	}
	if tr.tlsDir == "" || tr.sshKey == "" {
		fail := t.Skipf
		if os.Getenv("CI") == "true" {
			fail = t.Fatalf
		}
		fail("remote transports not configured: run scripts/libvirt-up.sh and scripts/sshd-up.sh, then source the env")
	}
	return tr
}

func (tr transports) tlsURI(port, pki string) string {
	return "qemu+tls://127.0.0.1:" + port + "/system?pkipath=" + filepath.Join(tr.tlsDir, pki)
}

func (tr transports) libsshURI(known string) string {
	return fmt.Sprintf("qemu+libssh://%s@127.0.0.1:%s/system?keyfile=%s&known_hosts=%s&known_hosts_verify=normal",
		tr.sshUser, tr.libsshPort, tr.sshKey, known)
}

func (tr transports) sshURI() string {
	return fmt.Sprintf("qemu+ssh://%s@127.0.0.1:%s/system?keyfile=%s", tr.sshUser, tr.sshPort, tr.sshKey)
}

// stopSSHD stops one sshd and every session it forked (killing only the
// listener would leave established sessions running), by PID.
func stopSSHD(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("sshd pid: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	kids := childrenOf(pid)
	for _, p := range append([]int{pid}, kids...) {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	for i := 0; alive(pid); i++ {
		if i > 100 {
			t.Fatalf("sshd %d did not exit", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startSSHD(t *testing.T, conf string) {
	t.Helper()
	if out, err := exec.Command("/usr/sbin/sshd", "-f", conf, "-E", strings.TrimSuffix(conf, ".conf")+".log").CombinedOutput(); err != nil {
		t.Fatalf("sshd -f %s: %v %s", conf, err, out)
	}
}

// childrenOf lists the direct children of pid.
func childrenOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether pid runs (a zombie counts as dead: PID 1 here does
// not reap daemonized children).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func newTransportIT(t *testing.T, e itEnv, cfg Config) *Hypervisor {
	t.Helper()
	cfg.Installation, cfg.Pool = "it-"+randHex(4), e.Pool
	h, err := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// Every transport reaches the real daemon with the pure-Go client, and the
// lifecycle events of a domain changed elsewhere arrive over each.
func TestIntegrationTransportsConnect(t *testing.T) {
	e := needEnv(t)
	tr := needTransports(t)
	zones := []ZoneURI{
		{Zone: "tls", URI: tr.tlsURI(tr.tlsPort, "client")},
		{Zone: "libssh", URI: tr.libsshURI(tr.knownHosts)},
		{Zone: "ssh", URI: tr.sshURI()},
	}
	h := newTransportIT(t, e, Config{Zones: zones})
	ctx := ctxT(t, 2*time.Minute)
	for _, z := range zones {
		if err := h.ZoneHealth()[z.Zone]; err != nil {
			t.Fatalf("zone %s: %v", z.Zone, err)
		}
		if _, err := h.Observe(ctx, z.Zone); err != nil {
			t.Errorf("observe over %s: %v", z.Zone, err)
		}
	}
	// A domain defined and undefined by someone else (virsh, on the unix
	// socket): each transport's subscription reports it.
	name := "bf-" + h.cfg.Installation + "-events"
	xml := fmt.Sprintf(`<domain type='qemu'><name>%s</name><memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os></domain>`, name)
	f := filepath.Join(t.TempDir(), "d.xml")
	if err := os.WriteFile(f, []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
	drain(h)
	t0 := time.Now()
	if out, err := exec.Command("virsh", "-c", e.URI, "define", f).CombinedOutput(); err != nil {
		t.Fatalf("virsh define: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("virsh", "-c", e.URI, "undefine", name).Run() })
	seen := map[string]time.Duration{}
	deadline := time.After(10 * time.Second)
	for len(seen) < len(zones) {
		select {
		case ev := <-h.Events():
			if ev.Kind == hypervisors.EventVM && ev.VM == name && ev.Detail == "defined" {
				if _, ok := seen[ev.Zone]; !ok {
					seen[ev.Zone] = time.Since(t0)
				}
			}
		case <-deadline:
			t.Fatalf("defined event seen on %v only", seen)
		}
	}
	for z, d := range seen {
		t.Logf("MEASURE lifecycle event over %s: %s after virsh define", z, d.Round(time.Millisecond))
	}
}

func drain(h *Hypervisor) {
	for {
		select {
		case <-h.Events():
		default:
			return
		}
	}
}

// Refusals are clear and classed ErrPermission: a server certificate from
// an untrusted CA, no client certificate, a client certificate libvirtd
// does not trust, an unknown host key and a changed host key. libvirtd
// itself refuses a TLS client without a certificate (client certificate
// authentication is really on).
func TestIntegrationTransportRefusals(t *testing.T) {
	e := needEnv(t)
	tr := needTransports(t)
	tests := []struct {
		zone, uri string
		want      []string
	}{
		{"tls-wrong-ca", tr.tlsURI(tr.tlsPort, "client-wrongca"), []string{"not signed by the CA", "client-wrongca/cacert.pem"}},
		{"tls-no-client-cert", tr.tlsURI(tr.tlsPort, "client-nocert"), []string{"no client certificate", "clientcert.pem"}},
		{"tls-untrusted-client-cert", tr.tlsURI(tr.tlsPort, "client-foreign"), []string{"refused our client certificate", "client-foreign/clientcert.pem"}},
		{"libssh-unknown-host", tr.libsshURI(tr.knownEmpty), []string{"is not in", tr.knownEmpty, "known_hosts_verify=normal"}},
		{"libssh-changed-host-key", tr.libsshURI(tr.knownChanged), []string{"does not match", tr.knownChanged, "changed"}},
	}
	var zones []ZoneURI
	for _, tc := range tests {
		zones = append(zones, ZoneURI{Zone: tc.zone, URI: tc.uri})
	}
	h := newTransportIT(t, e, Config{Zones: zones})
	health := h.ZoneHealth()
	for _, tc := range tests {
		err := health[tc.zone]
		t.Logf("%s: %v", tc.zone, err)
		if !errors.Is(err, hypervisors.ErrPermission) || !errors.Is(err, hypervisors.ErrUnreachable) {
			t.Errorf("%s: %v, want unreachable and permission denied", tc.zone, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error lacks %q", tc.zone, w)
			}
		}
	}

	// Straight to libvirtd, trusting its CA but offering no certificate.
	pem, err := os.ReadFile(filepath.Join(tr.tlsDir, "client", "cacert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	c, err := tls.Dial("tcp", "127.0.0.1:"+tr.tlsPort, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err == nil {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 1)
		n, rerr := c.Read(buf)
		if rerr == nil && n == 1 && buf[0] == 1 {
			t.Fatal("libvirtd accepted a TLS client without a certificate")
		}
		t.Logf("libvirtd to a client without certificate: read %d %v", n, rerr)
	} else {
		t.Logf("libvirtd to a client without certificate: %v", err)
	}
}

// One adapter, four zones (unix, tls through a relay, libssh, ssh): cutting
// one transport (the TLS path, then one sshd with its sessions) shows that
// zone down within a second and blocks no other zone, which keeps
// defining, starting and undefining; restoring it reconnects. A frozen
// path (a silent partition, no FIN) is seen by the probe.
func TestIntegrationTransportIndependence(t *testing.T) {
	e := needEnv(t)
	tr := needTransports(t)
	rl, err := relay.New("127.0.0.1:" + tr.tlsPort)
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	t.Cleanup(func() {
		if b, err := os.ReadFile(tr.libsshPID); err != nil || !alive(atoi(string(b))) {
			startSSHD(t, tr.libsshConf)
		}
	})
	zones := []ZoneURI{
		{Zone: "local", URI: e.URI},
		{Zone: "tls", URI: tr.tlsURI(rl.Port(), "client")},
		{Zone: "libssh", URI: tr.libsshURI(tr.knownHosts)},
		{Zone: "ssh", URI: tr.sshURI()},
	}
	h := newTransportIT(t, e, Config{Zones: zones, ProbeEvery: 250 * time.Millisecond, ProbeTimeout: time.Second,
		DeadAfter: 4 * time.Second, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, CallTimeout: 20 * time.Second})
	ctx := ctxT(t, 4*time.Minute)
	for _, z := range zones {
		if err := h.ZoneHealth()[z.Zone]; err != nil {
			t.Fatalf("zone %s: %v", z.Zone, err)
		}
	}
	// work runs a small define/start/stop/undefine cycle in a zone.
	cycle := 0
	work := func(zone string) {
		t.Helper()
		cycle++
		m := newMachine(h, fmt.Sprintf("indep-%s-%d", zone, cycle))
		cleanupMachine(t, h, zone, e.Pool, m)
		if err := h.CreateOverlay(ctx, zone, lvspec.OverlaySpec{Pool: e.Pool, Name: m.overlay, BaseImage: e.Image}); err != nil {
			t.Fatalf("%s: overlay: %v", zone, err)
		}
		spec := smallSpec(e.Pool, m)
		spec.Seed = ""
		tg := hypervisors.Target{Zone: zone, Name: m.name}
		for _, step := range []func() error{
			func() error { return h.DefineDomain(ctx, zone, spec) },
			func() error { return h.Start(ctx, tg) },
			func() error { return h.Stop(ctx, tg, 0) },
			func() error { return h.UndefineDomain(ctx, tg) },
			func() error { return h.DeleteVolume(ctx, zone, e.Pool, m.overlay) },
		} {
			if err := step(); err != nil {
				t.Fatalf("%s: %v", zone, err)
			}
		}
	}
	waitHealth := func(zone string, up bool, max time.Duration) time.Duration {
		t.Helper()
		t0 := time.Now()
		for {
			err := h.ZoneHealth()[zone]
			if (err == nil) == up {
				return time.Since(t0)
			}
			if time.Since(t0) > max {
				t.Fatalf("zone %s up=%t not reached in %s: %v", zone, up, max, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	others := func(down string) {
		t.Helper()
		for _, z := range zones {
			if z.Zone == down {
				continue
			}
			if err := h.ZoneHealth()[z.Zone]; err != nil {
				t.Errorf("zone %s unhealthy while %s is down: %v", z.Zone, down, err)
			}
			t0 := time.Now()
			work(z.Zone)
			t.Logf("MEASURE %s lifecycle while %s is down: %s", z.Zone, down, time.Since(t0).Round(time.Millisecond))
		}
		if _, err := h.Observe(ctx, down); !errors.Is(err, hypervisors.ErrUnreachable) {
			t.Errorf("observe %s while down: %v, want ErrUnreachable", down, err)
		}
	}

	rl.Cut()
	t.Logf("MEASURE tls cut -> zone down: %s", waitHealth("tls", false, 5*time.Second).Round(time.Millisecond))
	others("tls")
	if err := rl.Restore(); err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURE tls restored -> zone up: %s", waitHealth("tls", true, 10*time.Second).Round(time.Millisecond))
	work("tls")

	stopSSHD(t, tr.libsshPID)
	t.Logf("MEASURE sshd stopped -> libssh zone down: %s", waitHealth("libssh", false, 5*time.Second).Round(time.Millisecond))
	others("libssh")
	startSSHD(t, tr.libsshConf)
	t.Logf("MEASURE sshd restarted -> libssh zone up: %s", waitHealth("libssh", true, 10*time.Second).Round(time.Millisecond))
	work("libssh")

	// A silent partition: no FIN, nothing forwarded. Only the probe can
	// tell; the zone reports down after ProbeTimeout, and the connection
	// is dropped and redialled after DeadAfter.
	rl.Freeze()
	t.Logf("MEASURE tls frozen -> zone down (probe): %s", waitHealth("tls", false, 5*time.Second).Round(time.Millisecond))
	if err := h.ZoneHealth()["tls"]; !strings.Contains(err.Error(), "not answering") {
		t.Errorf("frozen zone health %v, want 'not answering'", err)
	}
	others("tls")
	time.Sleep(4 * time.Second) // past DeadAfter: the connection is dropped
	rl.Thaw()
	t.Logf("MEASURE tls thawed -> zone up: %s", waitHealth("tls", true, 15*time.Second).Round(time.Millisecond))
	work("tls")
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}
