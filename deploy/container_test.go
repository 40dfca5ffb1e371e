//go:build container

package deploy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// The container tests run the real image (scripts/container-test.sh builds
// it and names it in BIGFLEET_IMAGE) under podman with runc, as root.

func image(t *testing.T) string {
	t.Helper()
	img := os.Getenv("BIGFLEET_IMAGE")
	if img == "" {
		t.Fatal("BIGFLEET_IMAGE is not set; run scripts/container-test.sh (make container-test)")
	}
	return img
}

// podman runs podman with the runc runtime and returns its stdout.
func podman(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("podman", append([]string{"--runtime", "runc"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func mustPodman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := podman(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// TestImageContents inspects the image: metadata, and a filesystem with
// exactly one executable (the provider) and no shell.
func TestImageContents(t *testing.T) {
	img := image(t)
	var info []struct {
		Config struct {
			User         string
			Entrypoint   []string
			ExposedPorts map[string]struct{}
			Volumes      map[string]struct{}
		}
		Size int64
	}
	if err := json.Unmarshal([]byte(mustPodman(t, "image", "inspect", img)), &info); err != nil || len(info) != 1 {
		t.Fatalf("image inspect: %v", err)
	}
	c := info[0].Config
	if c.User != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532", c.User)
	}
	if strings.Join(c.Entrypoint, " ") != "/provider" {
		t.Errorf("entrypoint %q, want the provider", c.Entrypoint)
	}
	for _, p := range []string{"9000/tcp", "9090/tcp"} {
		if _, ok := c.ExposedPorts[p]; !ok {
			t.Errorf("port %s not exposed (%v)", p, c.ExposedPorts)
		}
	}
	if _, ok := c.Volumes["/var/lib/bigfleet"]; !ok {
		t.Errorf("/var/lib/bigfleet is not a volume (%v)", c.Volumes)
	}
	t.Logf("image size %.1f MiB", float64(info[0].Size)/(1<<20))

	root := mustPodman(t, "image", "mount", img)
	t.Cleanup(func() { podman(t, "image", "unmount", img) })
	var execs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		switch base := filepath.Base(p); base {
		case "sh", "bash", "dash", "ash", "busybox", "apt", "dpkg":
			t.Errorf("the image contains %s", rel)
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if fi.Mode()&0o111 != 0 {
				execs = append(execs, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(execs, ",") != "/provider" {
		t.Errorf("executables in the image: %v, want only /provider", execs)
	}
	fi, err := os.Stat(filepath.Join(root, "var/lib/bigfleet"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65532 || st.Gid != 65532 {
		t.Errorf("/var/lib/bigfleet owned by %d:%d, want 65532:65532 (a fresh volume must be writable)", st.Uid, st.Gid)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")); err != nil {
		t.Errorf("no CA bundle: %v", err)
	}
}

// container is one running provider container.
type container struct {
	t           *testing.T
	name        string
	grpcAddr    string
	metricsAddr string
}

// run starts the image detached with a read-only root, random loopback
// ports and args as the provider's flags.
func run(t *testing.T, name string, podmanArgs []string, args ...string) *container {
	t.Helper()
	full := append([]string{"run", "-d", "--name", name, "--read-only",
		"-p", "127.0.0.1::9000", "-p", "127.0.0.1::9090"}, podmanArgs...)
	full = append(full, image(t))
	full = append(full, args...)
	mustPodman(t, full...)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := podman(t, "logs", name)
			t.Logf("logs of %s:\n%s", name, logs)
		}
		podman(t, "rm", "-f", "-v", "-t", "0", name)
	})
	c := &container{t: t, name: name}
	c.ports()
	return c
}

// ports reads the host ports podman mapped (they change on restart).
func (c *container) ports() {
	c.t.Helper()
	c.grpcAddr = mustPodman(c.t, "port", c.name, "9000/tcp")
	c.metricsAddr = mustPodman(c.t, "port", c.name, "9090/tcp")
}

// waitReady polls /readyz until it says ready.
func (c *container) waitReady() {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		body, code, err := get("http://" + c.metricsAddr + "/readyz")
		if err == nil && code == http.StatusOK && strings.HasPrefix(body, "ready") {
			return
		}
		last = fmt.Sprint(code, " ", body, " ", err)
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("%s not ready after 60s: %s", c.name, last)
}

func get(url string) (string, int, error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}

func (c *container) client(creds credentials.TransportCredentials) pb.CapacityProviderClient {
	c.t.Helper()
	conn, err := grpc.NewClient(c.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	return pb.NewCapacityProviderClient(conn)
}

func waitState(t *testing.T, cl pb.CapacityProviderClient, id string, want pb.MachineState) *pb.Machine {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := cl.Get(ctx, &pb.MachineRef{Id: id})
		cancel()
		if err == nil && m.GetState() == want {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach %s: %v %v", id, want, m.GetState(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestContainerRun runs the image as the install docs do (simulator, state
// on a volume, read-only root), checks health, readiness, the process's
// uid, the missing shell, gRPC through the real client, the metrics, and
// that a killed and restarted container keeps its operation ids and fence
// marks.
func TestContainerRun(t *testing.T) {
	suffix := fmt.Sprint(os.Getpid())
	vol := "bigfleet-ct-state-" + suffix
	mustPodman(t, "volume", "create", vol)
	t.Cleanup(func() { podman(t, "volume", "rm", "-f", vol) })

	c := run(t, "bigfleet-ct-"+suffix, []string{"-v", vol + ":/var/lib/bigfleet"},
		"--use-fake-backend", "--seed-count", "4", "--installation-id", "ct",
		"--state", "/var/lib/bigfleet/state", "--addr", ":9000", "--metrics-addr", ":9090",
		"--reconcile-interval", "1s", "--log-format", "json")
	c.waitReady()

	if body, code, err := get("http://" + c.metricsAddr + "/healthz"); err != nil || code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz: %d %q %v", code, body, err)
	}
	var state struct {
		State struct {
			Pid int
		}
		HostConfig struct {
			ReadonlyRootfs bool
		}
	}
	var insp []json.RawMessage
	if err := json.Unmarshal([]byte(mustPodman(t, "container", "inspect", c.name)), &insp); err != nil || len(insp) != 1 {
		t.Fatalf("inspect: %v", err)
	}
	if err := json.Unmarshal(insp[0], &state); err != nil {
		t.Fatal(err)
	}
	if !state.HostConfig.ReadonlyRootfs {
		t.Error("the container's root filesystem is not read-only")
	}
	procStatus, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", state.State.Pid))
	if err != nil {
		t.Fatal(err)
	}
	uids := regexp.MustCompile(`(?m)^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$`).FindStringSubmatch(string(procStatus))
	if uids == nil || uids[1] != "65532" || uids[2] != "65532" || uids[3] != "65532" {
		t.Errorf("provider process uids %v, want 65532 (real, effective, saved)", uids)
	}
	if out, err := podman(t, "exec", c.name, "/bin/sh", "-c", "true"); err == nil {
		t.Errorf("/bin/sh ran in the container: %q", out)
	}

	cl := c.client(insecure.NewCredentials())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := cl.List(ctx, &pb.ListFilter{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list.GetMachines()) != 4 {
		t.Fatalf("List: %d machines, want 4", len(list.GetMachines()))
	}
	m0, m1 := list.GetMachines()[0].GetId(), list.GetMachines()[1].GetId()
	ack, err := cl.Create(ctx, &pb.CreateRequest{MachineId: m0, ShardId: "shard-a", ShardEpoch: 3, SequenceNumber: 10})
	if err != nil {
		t.Fatalf("Create %s: %v", m0, err)
	}
	op := ack.GetOperationId()
	waitState(t, cl, m0, pb.MachineState_MACHINE_STATE_IDLE)

	metrics, _, err := get("http://" + c.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`bigfleet_provider_build_info{goversion="go`, `grpc_server_handled_total{grpc_code="OK",grpc_method="Create",grpc_service="bigfleet.v1alpha1.CapacityProvider",grpc_type="unary"} 1`,
		`bigfleet_provider_state_healthy 1`, `bigfleet_provider_machines{instance_type=`} {
		if !strings.Contains(metrics, w) {
			t.Errorf("/metrics lacks %s", w)
		}
	}

	// The chart's NOTES: plan through exec of the provider itself.
	if out, err := podman(t, "exec", c.name, "/provider", "plan", "--server", "http://127.0.0.1:9090"); err != nil || !strings.Contains(out, "Plan for libvirt installation ct") {
		t.Errorf("exec /provider plan --server: %v\n%s", err, out)
	}

	// kill -9, start again on the same volume.
	mustPodman(t, "kill", "--signal", "KILL", c.name)
	mustPodman(t, "wait", c.name)
	mustPodman(t, "start", c.name)
	c.ports()
	c.waitReady()
	cl = c.client(insecure.NewCredentials())
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if m := waitState(t, cl, m0, pb.MachineState_MACHINE_STATE_IDLE); m.GetHost() == nil {
		t.Errorf("%s lost its host after the restart", m0)
	}
	// The retried Create answers the original operation id.
	ack, err = cl.Create(ctx2, &pb.CreateRequest{MachineId: m0, ShardId: "shard-a", ShardEpoch: 3, SequenceNumber: 11})
	if err != nil || ack.GetOperationId() != op {
		t.Errorf("retried Create after restart: op %q, %v; want the original %q", ack.GetOperationId(), err, op)
	}
	// The fence mark survived: an older token is refused.
	_, err = cl.Create(ctx2, &pb.CreateRequest{MachineId: m0, ShardId: "shard-a", ShardEpoch: 3, SequenceNumber: 9})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Create with a stale token after restart: %v, want FailedPrecondition", err)
	}
	// Operation ids never repeat across restarts.
	ack, err = cl.Create(ctx2, &pb.CreateRequest{MachineId: m1})
	if err != nil || ack.GetOperationId() == op || ack.GetOperationId() == "" {
		t.Errorf("Create %s after restart: op %q, %v; want a fresh id (not %q)", m1, ack.GetOperationId(), err, op)
	}
	waitState(t, cl, m1, pb.MachineState_MACHINE_STATE_IDLE)
}

// TestContainerRefusesBareStart checks the documented rule: without real
// hypervisor flags or --use-fake-backend the provider refuses to start and
// says how to run the simulator.
func TestContainerRefusesBareStart(t *testing.T) {
	cmd := exec.Command("podman", "--runtime", "runc", "run", "--rm", "--read-only", image(t))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("bare start: %v, want exit code 2\n%s", err, out)
	}
	if !strings.Contains(string(out), "--use-fake-backend") {
		t.Errorf("bare start does not say how to run the simulator:\n%s", out)
	}
}

// TestContainerMTLS mounts a server keypair and client CA the way the chart
// does (/etc/bigfleet/tls, read-only) and checks that a client with a
// certificate gets through and one without is refused.
func TestContainerMTLS(t *testing.T) {
	ca := newCA(t, "ct CA")
	server := ca.issue(t, "localhost", false)
	client := ca.issue(t, "bigfleet-shard", true)
	dir, err := os.MkdirTemp("", "bigfleet-ct-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": server.certPEM, "tls.key": server.keyPEM, "ca.crt": ca.certPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := run(t, fmt.Sprintf("bigfleet-ct-mtls-%d", os.Getpid()), []string{"-v", dir + ":/etc/bigfleet/tls:ro"},
		"--use-fake-backend", "--seed-count", "2",
		"--tls-cert", "/etc/bigfleet/tls/tls.crt", "--tls-key", "/etc/bigfleet/tls/tls.key", "--tls-ca", "/etc/bigfleet/tls/ca.crt")
	c.waitReady()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.certPEM)
	cert, err := tls.X509KeyPair(client.certPEM, client.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(c.grpcAddr)
	c.grpcAddr = net.JoinHostPort("localhost", port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	good := c.client(credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}))
	if list, err := good.List(ctx, &pb.ListFilter{}); err != nil || len(list.GetMachines()) != 2 {
		t.Errorf("List with a client certificate: %v (%d machines)", err, len(list.GetMachines()))
	}
	anon := c.client(credentials.NewTLS(&tls.Config{RootCAs: pool}))
	if _, err := anon.List(ctx, &pb.ListFilter{}); status.Code(err) != codes.Unavailable {
		t.Errorf("List without a client certificate: %v, want Unavailable (handshake refused)", err)
	}
}
