package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// binary is the provider built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	bin, cleanup, err := providertest.Build("provider-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer cleanup()
	binary = bin
	defer stopBench()
	return m.Run()
}

// shape is one simulator shape every behaviour test runs against.
type shape struct {
	name string
	args []string
}

var shapes = []shape{
	{name: "libvirt"},
	{name: "proxmox", args: []string{"--hypervisor", "proxmox"}},
}

// eachShape runs f as a parallel subtest per simulator shape.
func eachShape(t *testing.T, f func(t *testing.T, sh shape)) {
	t.Helper()
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			f(t, sh)
		})
	}
}

// server is one provider subprocess plus a gRPC client to it.
type server struct {
	t       testing.TB
	args    []string // without --addr/--metrics-addr
	cmd     *exec.Cmd
	done    chan struct{}
	exitErr error
	stderr  *providertest.SyncBuffer
	addr    string
	maddr   string
	conn    *grpc.ClientConn
	c       pb.CapacityProviderClient
	ready   time.Duration // time from exec to /readyz 200
}

// start launches the provider with the fake backend on free loopback ports
// and waits for /readyz. args come after the harness's own flags, so they
// win.
func start(t testing.TB, args ...string) *server {
	t.Helper()
	s := &server{t: t, args: args}
	s.launch()
	t.Cleanup(s.stop)
	return s
}

func (s *server) launch() {
	s.t.Helper()
	var lastErr string
	for attempt := 0; attempt < 3; attempt++ {
		s.addr, s.maddr = providertest.FreeAddr(s.t), providertest.FreeAddr(s.t)
		all := append([]string{"serve", "--use-fake-backend", "--addr", s.addr, "--metrics-addr", s.maddr,
			"--log-level", "warn"}, s.args...)
		s.cmd = exec.Command(binary, all...)
		s.stderr = &providertest.SyncBuffer{}
		s.cmd.Stderr = s.stderr
		s.cmd.Stdout = s.stderr
		began := time.Now()
		if err := s.cmd.Start(); err != nil {
			s.t.Fatalf("start provider: %v", err)
		}
		s.done = make(chan struct{})
		go func(cmd *exec.Cmd, done chan struct{}) {
			s.exitErr = cmd.Wait()
			close(done)
		}(s.cmd, s.done)
		if err := s.waitReady(120 * time.Second); err != nil {
			lastErr = err.Error()
			s.kill()
			if strings.Contains(s.stderr.String(), "address already in use") {
				continue
			}
			s.t.Fatalf("provider %v did not become ready: %v\nstderr:\n%s", s.args, err, s.stderr.String())
		}
		s.ready = time.Since(began)
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20), grpc.MaxCallRecvMsgSize(1<<30)))
		if err != nil {
			s.t.Fatal(err)
		}
		s.conn, s.c = conn, pb.NewCapacityProviderClient(conn)
		return
	}
	s.t.Fatalf("provider never started: %s", lastErr)
}

func (s *server) waitReady(max time.Duration) error {
	err := providertest.WaitReady(s.maddr, s.done, max)
	if errors.Is(err, providertest.ErrExited) {
		return fmt.Errorf("exited: %v", s.exitErr)
	}
	return err
}

// dial opens an extra, independent connection.
func (s *server) dial() pb.CapacityProviderClient {
	s.t.Helper()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20), grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { conn.Close() })
	return pb.NewCapacityProviderClient(conn)
}

func (s *server) kill() {
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
	default:
		s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
	}
	providertest.NoRace(s.t, "provider "+strings.Join(s.args, " "), s.stderr.String())
}

func (s *server) stop() { s.kill() }

// restart kills the process with SIGKILL and starts it again with the same
// flags (new ports).
func (s *server) restart() {
	s.t.Helper()
	s.kill()
	s.launch()
}

// terminate sends SIGTERM and returns the exit code.
func (s *server) terminate() int {
	s.t.Helper()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(90 * time.Second):
		s.kill()
		s.t.Fatalf("provider did not exit after SIGTERM\nstderr:\n%s", s.stderr.String())
	}
	return s.cmd.ProcessState.ExitCode()
}

// httpGet fetches a path from the metrics listener.
func (s *server) httpGet(path string) string {
	s.t.Helper()
	resp, err := http.Get("http://" + s.maddr + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (s *server) pid() int { return s.cmd.Process.Pid }

// ctx returns a per-call context with a generous deadline.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func code(err error) codes.Code { return status.Code(err) }

// Settled/transitional classification.
func stable(st pb.MachineState) bool {
	switch st {
	case pb.MachineState_MACHINE_STATE_SPECULATIVE, pb.MachineState_MACHINE_STATE_IDLE,
		pb.MachineState_MACHINE_STATE_CONFIGURED, pb.MachineState_MACHINE_STATE_FAILED:
		return true
	}
	return false
}

// runExit runs `provider serve --use-fake-backend <args>` expecting it to
// exit by itself (startup validation), and returns its combined output and
// exit code. It fails the test if the process is still running (listening)
// after a generous deadline.
func runExit(t testing.TB, args ...string) (string, int) {
	t.Helper()
	all := append([]string{"serve", "--use-fake-backend", "--addr", providertest.FreeAddr(t), "--metrics-addr", providertest.FreeAddr(t)}, args...)
	return runRaw(t, all...)
}

func runRaw(t testing.TB, args ...string) (string, int) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(c, binary, args...)
	out, err := cmd.CombinedOutput()
	if c.Err() != nil {
		t.Fatalf("provider %v did not exit on its own:\n%s", args, out)
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("run provider: %v", err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}
