package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/planschema"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// launchRaw starts a provider with exactly the given arguments, for the
// tests of the metrics listener itself (start assumes a plain-HTTP
// listener on a port of its choosing).
func launchRaw(t *testing.T, args ...string) *providertest.Process {
	t.Helper()
	return providertest.StartProcess(t, binary, args...)
}

// grpcHealth asks the provider's gRPC health service about service.
func grpcHealth(t *testing.T, addr string, creds grpc.DialOption, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(c, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return 0, err
	}
	return resp.Status, nil
}

// waitServing polls the gRPC health service until the overall status is
// SERVING or the process exits.
func waitServing(t *testing.T, p *providertest.Process, addr string, creds grpc.DialOption) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if p.Exited() {
			t.Fatalf("provider exited:\n%s", p.Output())
		}
		if st, err := grpcHealth(t, addr, creds, ""); err == nil && st == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gRPC never served:\n%s", p.Output())
		}
	}
}

// TestDefaultMetricsAddrBusy starts a provider with the default
// --metrics-addr (:9090) while that port is taken, as when several
// providers share a host: it keeps serving gRPC, logs why the listener
// is off, and reports it on the metrics-listener health service. An
// explicitly given address that is taken still fails the start.
func TestDefaultMetricsAddrBusy(t *testing.T) {
	hold, err := net.Listen("tcp", ":9090")
	switch {
	case err == nil:
		defer hold.Close()
	case errors.Is(err, syscall.EADDRINUSE):
		// Someone else holds it: just as busy.
	default:
		t.Fatalf("occupy :9090: %v", err)
	}
	addr := providertest.FreeAddr(t)
	p := launchRaw(t, "serve", "--use-fake-backend", "--seed-count", "2", "--addr", addr)
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	waitServing(t, p, addr, plain)
	if st, err := grpcHealth(t, addr, plain, "metrics-listener"); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health of metrics-listener: %v, %v; want NOT_SERVING", st, err)
	}
	if log := p.Output(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "metrics listener is off") || !strings.Contains(log, ":9090") {
		t.Errorf("no error log about the metrics listener:\n%s", log)
	}
	// The API works without the listener.
	conn, err := grpc.NewClient(addr, plain)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := len(providertest.ListAll(t, pb.NewCapacityProviderClient(conn))); got != 2 {
		t.Errorf("List: %d machines, want 2", got)
	}

	// Explicit: the same busy address fails the start.
	busy := providertest.FreeAddr(t)
	l, err := net.Listen("tcp", busy)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out, code := runRaw(t, "serve", "--use-fake-backend", "--addr", providertest.FreeAddr(t), "--metrics-addr", busy)
	if code == 0 || !strings.Contains(out, "listen on --metrics-addr "+busy) {
		t.Errorf("an explicit busy --metrics-addr: exit %d\n%s", code, out)
	}
}

// TestMetricsListenerHealthWhenServing checks the metrics-listener health
// service says SERVING when the listener is up.
func TestMetricsListenerHealthWhenServing(t *testing.T) {
	s := start(t, "--seed-count", "2")
	st, err := grpcHealth(t, s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()), "metrics-listener")
	if err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of metrics-listener: %v, %v; want SERVING", st, err)
	}
}

// TestAdminNeedsOptIn checks the endpoints that change the simulated
// world are off on a plain simulator and on with --fake-admin.
func TestAdminNeedsOptIn(t *testing.T) {
	off := start(t, "--seed-count", "2")
	resp, err := http.Post(off.MetricsURL()+"/admin/unreachable?zone=local-a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "--fake-admin") {
		t.Errorf("admin without --fake-admin: %s %s", resp.Status, body)
	}
	if got := off.Metric("bigfleet_provider_zone_up", `zone="local-a"`); got != 1 {
		t.Errorf("the refused call changed the world: zone_up{local-a} = %v", got)
	}

	on := start(t, "--seed-count", "2", "--fake-admin")
	on.Admin("unreachable?zone=local-a")
	waitMetricBelow(t, on, "bigfleet_provider_zone_up", 1, `zone="local-a"`)
	// A slot without a VM is named clearly, not with a simulator error.
	ids := speculative(t, on.c, 1)
	resp, err = http.Post(on.MetricsURL()+"/admin/stop?machine="+ids[0], "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "has no VM yet") {
		t.Errorf("stop of a SPECULATIVE slot: %s %s", resp.Status, body)
	}
}

func waitMetricBelow(t *testing.T, s *server, name string, max float64, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s.Metric(name, labels...) >= max {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v never went below %v", name, labels, max)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDebugPlanCoalesces sends 20 concurrent GET /debug/plan and counts
// the observe calls they cost: they share one observation of the two
// zones instead of making one each (40 calls before).
func TestDebugPlanCoalesces(t *testing.T) {
	s := start(t, "--seed-count", "4", "--reconcile-interval", "0", "--fake-latency", "200ms")
	observes := func() float64 {
		return s.Metric("bigfleet_provider_hypervisor_calls_total", `op="observe"`)
	}
	// Let the start-up pass finish: the count stops moving.
	waitMetric(t, s, "bigfleet_provider_hypervisor_calls_total", 2, `op="observe"`)
	before := observes()
	var wg sync.WaitGroup
	bodies := make([]string, 20)
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(s.MetricsURL() + "/debug/plan?max_age=0s")
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Age") == "" {
				t.Errorf("GET /debug/plan: %s, Age %q: %s", resp.Status, resp.Header.Get("Age"), b)
			}
			bodies[i] = string(b)
		}()
	}
	wg.Wait()
	// One observation is two zones; a request that raced past the first
	// one's start may cause a second.
	n := observes() - before
	t.Logf("20 concurrent GET /debug/plan: %v observe calls", n)
	if n > 4 {
		t.Errorf("20 concurrent GET /debug/plan made %v observe calls, want at most 4", n)
	}
	if err := planschema.Validate([]byte(bodies[0])); err != nil {
		t.Errorf("/debug/plan does not validate against docs/plan.schema.json: %v", err)
	}
	// A stored plan is served with its age when the caller allows it.
	before = observes()
	resp, err := http.Get(s.MetricsURL() + "/debug/plan?max_age=1h")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := observes() - before; n != 0 {
		t.Errorf("max_age=1h observed again (%v calls)", n)
	}
	resp, err = http.Get(s.MetricsURL() + "/debug/plan?max_age=forever")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("max_age=forever: %s", resp.Status)
	}
}

// TestMetricsTLS serves the metrics listener over HTTPS with the gRPC
// certificate and reads it with a client that trusts that CA, including
// `provider plan --server https://... --server-ca`.
func TestMetricsTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, dir)
	addr, maddr := providertest.FreeAddr(t), providertest.FreeAddr(t)
	p := launchRaw(t, "serve", "--use-fake-backend", "--seed-count", "2", "--addr", addr, "--metrics-addr", maddr,
		"--tls-cert", certFile, "--tls-key", keyFile, "--metrics-tls")
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(caPEM)
	waitServing(t, p, addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))

	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	var resp *http.Response
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err = hc.Get("https://" + maddr + "/readyz"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("https /readyz: %v\n%s", err, p.Output())
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "ready") {
		t.Errorf("https /readyz: %s %s", resp.Status, body)
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + maddr + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "bigfleet_provider_") {
			t.Errorf("plain HTTP got the metrics from a --metrics-tls listener")
		}
	}
	out, code := runRaw(t, "plan", "--server", "https://"+maddr, "--server-ca", caFile, "--json")
	if code != 0 {
		t.Fatalf("plan --server https: exit %d\n%s", code, out)
	}
	if err := planschema.Validate([]byte(out)); err != nil {
		t.Errorf("plan over https does not validate: %v", err)
	}
	if out, code := runRaw(t, "plan", "--server", "https://"+maddr); code != 1 || !strings.Contains(out, "certificate") {
		t.Errorf("plan --server https without the CA: exit %d\n%s", code, out)
	}
}

// writeTestPKI writes a CA and a server certificate for 127.0.0.1 signed
// by it; it returns the CA, certificate and key file names.
func writeTestPKI(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "provider"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", der), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}
