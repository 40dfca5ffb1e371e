package providertest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
)

// The tests run this test binary as the provider: with fakeEnv set it is
// fakeProvider, a server with the provider's listeners (gRPC Get answers
// with its pid, /readyz) and a few misbehaviours chosen by --mode.
const fakeEnv = "PROVIDERTEST_FAKE_PROVIDER"

var self string

func TestMain(m *testing.M) {
	if os.Getenv(fakeEnv) != "" {
		os.Exit(fakeProvider(os.Args[1:]))
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	self = exe
	os.Setenv(fakeEnv, "1")
	os.Exit(m.Run())
}

type fakeAPI struct {
	pb.UnimplementedCapacityProviderServer
}

func (fakeAPI) Get(context.Context, *pb.MachineRef) (*pb.Machine, error) {
	return &pb.Machine{Id: strconv.Itoa(os.Getpid())}, nil
}

func fakeProvider(args []string) int {
	if tag := os.Getenv("PROVIDERTEST_TAG"); tag != "" {
		fmt.Printf("tag %q\n", tag) // before listening: in the output once ready
	}
	if len(args) == 0 || args[0] != "serve" {
		fmt.Println("fake provider: want serve")
		return 1
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	mode := fs.String("mode", "ok", "ok, busy-once, race, never-ready or exit")
	marker := fs.String("marker", "", "busy-once: the file that says the first run happened")
	addr := fs.String("addr", "", "")
	maddr := fs.String("metrics-addr", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		return 1
	}
	switch *mode {
	case "exit":
		fmt.Println("fake provider refuses to start")
		return 3
	case "busy-once":
		if _, err := os.Stat(*marker); errors.Is(err, os.ErrNotExist) {
			os.WriteFile(*marker, nil, 0o644)
			fmt.Printf("listen on --addr %s: address already in use\n", *addr)
			return 1
		}
	case "race":
		fmt.Fprint(os.Stderr, "==================\nWARNING: DATA RACE\nWrite at 0x00c000 by goroutine 7:\n  main.f()\n==================\n")
	}
	gl, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	srv := grpc.NewServer()
	pb.RegisterCapacityProviderServer(srv, fakeAPI{})
	go srv.Serve(gl)
	code := http.StatusOK
	if *mode == "never-ready" {
		code = http.StatusServiceUnavailable
	}
	http.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) })
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	ml, err := net.Listen("tcp", *maddr)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	go http.Serve(ml, nil)
	fmt.Printf("fake provider up, pid %d\n", os.Getpid())
	<-term
	fmt.Println("fake provider terminating")
	return 0
}

func fake(t *testing.T, o Options, mode string) *Provider {
	o.Args = append([]string{"serve", "--mode", mode}, o.Args...)
	return Start(t, self, o)
}

// pidOf asks the current process for its pid over gRPC.
func pidOf(t *testing.T, c pb.CapacityProviderClient) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := c.Get(ctx, &pb.MachineRef{})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	pid, _ := strconv.Atoi(m.Id)
	return pid
}

// procState is the state letter in /proc/pid/stat (R, S, T, Z...).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

func waitProcState(t *testing.T, pid int, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); procState(pid) != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d in state %q, want %q", pid, procState(pid), want)
		}
	}
}

func TestProviderLaunchKillRestart(t *testing.T) {
	p := fake(t, Options{}, "ok")
	c := p.Client()
	first := p.Pid()
	if got := pidOf(t, c); got != first {
		t.Fatalf("Get reached pid %d, want %d", got, first)
	}
	if code, _ := p.HTTPGet("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d", code)
	}
	if p.TimeToReady() <= 0 {
		t.Errorf("TimeToReady %v", p.TimeToReady())
	}
	if !strings.HasPrefix(p.MetricsURL(), "http://127.0.0.1:") || !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Errorf("addresses %q %q", p.Addr(), p.MetricsURL())
	}
	argv := p.Argv()
	if diff := cmp.Diff([]string{"serve", "--mode", "ok", "--addr", p.Addr(), "--metrics-addr", p.MetricsAddr()}, argv); diff != "" {
		t.Errorf("Argv (-want +got):\n%s", diff)
	}

	p.Restart()
	second := p.Pid()
	if second == first || procState(first) != "" {
		t.Fatalf("restart: pid %d -> %d, old one in state %q", first, second, procState(first))
	}
	if got := pidOf(t, c); got != second {
		t.Errorf("the client taken before the restart reached pid %d, want the new %d", got, second)
	}
	if n := strings.Count(p.Output(), "fake provider up"); n != 1 {
		t.Errorf("Output holds %d launches, want only the current one:\n%s", n, p.Output())
	}
	if n := strings.Count(p.Log(), "===== launch "); n != 2 {
		t.Errorf("Log holds %d launch headers, want 2:\n%s", n, p.Log())
	}

	p.Kill()
	if _, err := c.Get(context.Background(), &pb.MachineRef{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Get after Kill: %v, want Unavailable", err)
	}
	if p.ExitCode() != -1 {
		t.Errorf("exit code after SIGKILL %d, want -1", p.ExitCode())
	}
	p.Launch()
	if got := pidOf(t, c); got != p.Pid() {
		t.Errorf("Get after Launch reached %d, want %d", got, p.Pid())
	}
}

func TestProviderStopContTerminate(t *testing.T) {
	p := fake(t, Options{}, "ok")
	pid := p.Pid()
	p.Stop()
	waitProcState(t, pid, "T")
	hc := &http.Client{Timeout: 300 * time.Millisecond}
	if resp, err := hc.Get(p.MetricsURL() + "/readyz"); err == nil {
		resp.Body.Close()
		t.Errorf("a stopped provider answered /readyz: %s", resp.Status)
	}
	p.Cont()
	if code, _ := p.HTTPGet("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after Cont: %d", code)
	}
	// Terminate reaches a paused process too.
	p.Stop()
	waitProcState(t, pid, "T")
	if code := p.Terminate(); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	if !strings.Contains(p.Output(), "fake provider terminating") {
		t.Errorf("no graceful exit in the output:\n%s", p.Output())
	}
	if _, err := p.Client().Get(context.Background(), &pb.MachineRef{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Get after Terminate: %v, want Unavailable", err)
	}
}

func TestKillReapsAPausedProcess(t *testing.T) {
	p := fake(t, Options{}, "ok")
	p.Stop()
	waitProcState(t, p.Pid(), "T")
	p.Kill()
	if !p.Exited() || procState(p.Pid()) != "" {
		t.Errorf("a paused provider survived Kill: state %q", procState(p.Pid()))
	}
}

func TestLaunchRetriesATakenPort(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "first-run")
	p := fake(t, Options{Args: []string{"--marker", marker}}, "busy-once")
	log := p.Log()
	if strings.Count(log, "===== launch ") != 2 || !strings.Contains(log, "address already in use") {
		t.Errorf("want a refused launch and a second one:\n%s", log)
	}
	if strings.Contains(p.Output(), "address already in use") {
		t.Errorf("Output of the ready launch holds the refused one's:\n%s", p.Output())
	}
}

func TestLogFileKeepsEveryLaunch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "provider.log")
	p := fake(t, Options{LogFile: path}, "ok")
	p.Restart()
	if p.Terminate() != 0 {
		t.Fatal("exit code")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(b), "fake provider up"); got != 2 {
		t.Errorf("log file holds %d launches, want 2:\n%s", got, b)
	}
	if p.Log() != string(b) {
		t.Errorf("Log differs from the file")
	}
	if diff := cmp.Diff(1, strings.Count(p.Output(), "fake provider up")); diff != "" {
		t.Errorf("launches in Output (-want +got):\n%s", diff)
	}
	if !strings.HasSuffix(string(b), p.Output()) || !strings.Contains(p.Output(), "terminating") {
		t.Errorf("Output is not the file's last launch:\n%s", p.Output())
	}
}

// recorder is a testing.TB that records failures instead of failing;
// Fatal ends the calling goroutine as testing does.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) Error(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func (r *recorder) failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

// onGoroutine runs f as a test body (Fatal ends it).
func onGoroutine(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

func TestRaceReportFailsTheTestOnce(t *testing.T) {
	r := &recorder{TB: t}
	onGoroutine(func() {
		p := Start(r, self, Options{Args: []string{"serve", "--mode", "race"}})
		p.Kill()
		p.Kill()
	})
	got := r.failures()
	if len(got) != 1 || !strings.Contains(got[0], "WARNING: DATA RACE") || !strings.Contains(got[0], "main.f()") {
		t.Errorf("failures %q, want one race report", got)
	}
}

// TestWaitPathHealthz launches a provider that is alive but never ready
// (a standby replica) by waiting for /healthz instead of /readyz.
func TestWaitPathHealthz(t *testing.T) {
	p := fake(t, Options{WaitPath: "/healthz", ReadyTimeout: 30 * time.Second}, "never-ready")
	if got := pidOf(t, p.Client()); got != p.Pid() {
		t.Errorf("Get reached pid %d, want %d", got, p.Pid())
	}
	if code, _ := p.HTTPGet("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz: %d, want 503 (the mode never gets ready)", code)
	}
	p.Restart()
	if got := pidOf(t, p.Client()); got != p.Pid() {
		t.Errorf("after Restart, Get reached pid %d, want %d", got, p.Pid())
	}
}

func TestNotReadyFailsAndLeavesNoProcess(t *testing.T) {
	r := &recorder{TB: t}
	onGoroutine(func() {
		Start(r, self, Options{Args: []string{"serve", "--mode", "never-ready"}, ReadyTimeout: time.Second})
	})
	got := r.failures()
	if len(got) != 1 || !strings.Contains(got[0], "did not become ready") || !strings.Contains(got[0], "fake provider up") {
		t.Fatalf("failures %q, want one saying it did not become ready, with the output", got)
	}
	// Start did not return; find the process through its output.
	var pid int
	if _, err := fmt.Sscanf(got[0][strings.Index(got[0], "fake provider up"):], "fake provider up, pid %d", &pid); err != nil {
		t.Fatal(err)
	}
	if st := procState(pid); st != "" {
		t.Errorf("the provider that never became ready is still there: state %q", st)
	}
}

func TestRun(t *testing.T) {
	out, code := Run(t, self, 30*time.Second, "serve", "--mode", "exit")
	if code != 3 || !strings.Contains(out, "refuses to start") {
		t.Errorf("Run: exit %d, output %q", code, out)
	}
	r := &recorder{TB: t}
	onGoroutine(func() {
		Run(r, self, 2*time.Second, "serve", "--mode", "ok", "--addr", FreeAddr(t), "--metrics-addr", FreeAddr(t))
	})
	if got := r.failures(); len(got) != 1 || !strings.Contains(got[0], "did not exit on its own") {
		t.Errorf("Run of a process that stays: failures %q", got)
	}
}

func TestStartProcess(t *testing.T) {
	addr, maddr := FreeAddr(t), FreeAddr(t)
	p := StartProcess(t, self, "serve", "--addr", addr, "--metrics-addr", maddr)
	if err := WaitReady(maddr, p.Done(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Exited() {
		t.Fatal("exited")
	}
	if code := p.Terminate(); code != 0 || !strings.Contains(p.Output(), "fake provider up") {
		t.Errorf("exit %d, output %q", code, p.Output())
	}
}

// Options.Env and RunEnv reach the child's environment, beside the
// test's own (the child still sees PROVIDERTEST_FAKE_PROVIDER).
func TestEnv(t *testing.T) {
	out, code := RunEnv(t, self, []string{"PROVIDERTEST_TAG=run-env"}, 30*time.Second, "serve", "--mode", "exit")
	if code != 3 || !strings.Contains(out, `tag "run-env"`) {
		t.Errorf("RunEnv: exit %d, output %q", code, out)
	}
	p := fake(t, Options{Env: []string{"PROVIDERTEST_TAG=start-env"}}, "ok")
	if !strings.Contains(p.Output(), `tag "start-env"`) {
		t.Errorf("Start with Env: output %q", p.Output())
	}
	p.Restart()
	if !strings.Contains(p.Output(), `tag "start-env"`) {
		t.Errorf("a relaunch lost Env: output %q", p.Output())
	}
	if out, _ := Run(t, self, 30*time.Second, "serve", "--mode", "exit"); strings.Contains(out, "tag") {
		t.Errorf("Run without Env: output %q", out)
	}
}
