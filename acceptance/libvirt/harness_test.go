//go:build integration

package libvirt

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// Instance types small enough for TCG guests to boot in seconds, and
// huge.1, larger than any host this suite runs on (1 TiB; only
// TestCreateLargerThanTheHost offers it).
const instanceTypes = `{"tiny.1": {"vcpu": 1, "memory_mib": 256}, "huge.1": {"vcpu": 1, "memory_mib": 1048576}}`

// offering is one entry of the --offerings file.
type offering struct {
	InstanceType string `json:"instance_type"`
	Zone         string `json:"zone"`
	Count        int    `json:"count"`
}

// config is one provider launch.
type config struct {
	// connect is the --connect value, e.g. "a=qemu:///system".
	connect string
	// pools is the --storage-pool value, e.g. "a=bigfleet-test-a".
	pools     string
	offerings []offering
	// extra flags appended last.
	extra []string
}

// provider is the provider run for one installation, plus its stable
// client.
type provider struct {
	*providertest.Provider
	t     *testing.T
	cfg   config
	inst  string
	state string
	log   string // path of the log file (all launches appended)
	dir   string
	c     pb.CapacityProviderClient
}

// newInstallation returns a fresh installation id short enough (<= 12
// characters) to survive VMName's truncation, so the domain name prefix
// identifies it.
func newInstallation() string {
	inst := "acc-" + randHex(3)
	instMu.Lock()
	insts = append(insts, inst)
	instMu.Unlock()
	return inst
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// prefix is the name prefix of every domain and volume of inst.
func prefix(inst string) string { return "bf-" + inst + "-" }

// startProvider launches the provider for a new installation, registers
// the cleanup (kill, then sweep of the installation's domains and
// volumes) and waits until /readyz answers 200.
func startProvider(t *testing.T, cfg config) *provider {
	t.Helper()
	needSubstrate(t)
	dir := t.TempDir()
	inst := newInstallation()
	p := &provider{t: t, cfg: cfg, inst: inst, dir: dir, state: filepath.Join(dir, "state"),
		log: filepath.Join(logDir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+inst+".log")}
	types := filepath.Join(dir, "types.json")
	offs := filepath.Join(dir, "offerings.json")
	b, _ := json.Marshal(cfg.offerings)
	if err := os.WriteFile(types, []byte(instanceTypes), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(offs, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Runs last: nothing of the installation may outlive the test.
	t.Cleanup(func() {
		ensureDaemon(t)
		if left := sweep(t, inst); len(left) > 0 {
			t.Logf("cleanup removed %v", left)
		}
	})
	t.Cleanup(func() {
		if p.Provider != nil {
			p.Kill()
		}
		if t.Failed() {
			p.dumpLog()
		}
	})
	p.Provider = providertest.Start(t, binary, providertest.Options{
		Args: p.args(), LogFile: p.log, ReadyTimeout: 60 * time.Second,
		Dial: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20), grpc.MaxCallRecvMsgSize(64<<20))},
	})
	p.c = p.Client()
	return p
}

func (p *provider) args() []string {
	return append([]string{"serve",
		"--connect", p.cfg.connect, "--storage-pool", p.cfg.pools,
		"--image", sub.Image, "--network", sub.Network, "--domain-type", "qemu",
		"--kernel", sub.Kernel, "--initrd", sub.Initrd, "--kernel-cmdline", guestCmdline,
		"--instance-types", filepath.Join(p.dir, "types.json"), "--offerings", filepath.Join(p.dir, "offerings.json"),
		"--state", p.state, "--installation-id", p.inst,
		"--reconcile-interval", "2s", "--log-level", "debug",
		// The suite runs up to 8 one-vCPU guests on a 2-CPU host: allow
		// that vCPU overcommit, or the Create check (--capacity-check,
		// default warn) fails them. Memory is never overcommitted.
		"--capacity-overcommit", "16",
	}, p.cfg.extra...)
}

// dumpLog prints the tail of the provider log into the test output.
func (p *provider) dumpLog() {
	b, _ := os.ReadFile(p.log)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		// Get polling is noise.
		if !strings.Contains(l, "CapacityProvider/Get ") {
			lines = append(lines, l)
		}
	}
	if len(lines) > 400 {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines in %s)", len(lines)-400, p.log)}, lines[len(lines)-400:]...)
	}
	p.t.Logf("provider log %s:\n%s", p.log, strings.Join(lines, "\n"))
}

func rpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ---- gRPC helpers ----

func (p *provider) get(id string) *pb.Machine {
	p.t.Helper()
	return providertest.Get(p.t, p.c, id)
}

func (p *provider) create(id string) time.Time {
	p.t.Helper()
	ack, err := p.c.Create(rpcCtx(p.t), &pb.CreateRequest{MachineId: id})
	if err != nil {
		p.t.Fatalf("Create %s: %v", id, err)
	}
	if got := ack.GetMachine().GetState(); got != pb.MachineState_MACHINE_STATE_CREATING {
		p.t.Fatalf("Create %s: ack state %s, want CREATING", id, got)
	}
	return time.Now()
}

func (p *provider) configure(id, cluster string, blob []byte) time.Time {
	p.t.Helper()
	t0 := time.Now()
	ack, err := p.c.Configure(rpcCtx(p.t), &pb.ConfigureRequest{MachineId: id, ClusterId: cluster, BootstrapBlob: blob})
	if err != nil {
		p.t.Fatalf("Configure %s: %v", id, err)
	}
	if got := ack.GetMachine().GetState(); got != pb.MachineState_MACHINE_STATE_CONFIGURING {
		p.t.Fatalf("Configure %s: ack state %s, want CONFIGURING", id, got)
	}
	return t0
}

func (p *provider) drain(id string, grace int64) time.Time {
	p.t.Helper()
	t0 := time.Now()
	if _, err := p.c.Drain(rpcCtx(p.t), &pb.DrainRequest{MachineId: id, GracePeriodSeconds: grace}); err != nil {
		p.t.Fatalf("Drain %s: %v", id, err)
	}
	return t0
}

func (p *provider) delete(id string) time.Time {
	p.t.Helper()
	t0 := time.Now()
	if _, err := p.c.Delete(rpcCtx(p.t), &pb.DeleteRequest{MachineId: id}); err != nil {
		p.t.Fatalf("Delete %s: %v", id, err)
	}
	return t0
}

// waitState polls Get until the machine is in want. Reaching FAILED when
// FAILED is not wanted fails the test at once with the machine's
// last_error.
func (p *provider) waitState(id string, want pb.MachineState, max time.Duration) *pb.Machine {
	p.t.Helper()
	return providertest.WaitState(p.t, p.c, id, want, max)
}

// ---- host-side helpers (virsh, qemu-img) ----

// virsh runs virsh against the substrate URI with a deadline.
func virsh(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "virsh", append([]string{"-c", sub.URI}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func mustVirsh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := virsh(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// domains lists all domain names (any state) starting with pfx.
func domains(t *testing.T, pfx string) []string {
	t.Helper()
	var out []string
	for _, n := range strings.Fields(mustVirsh(t, "list", "--all", "--name")) {
		if strings.HasPrefix(n, pfx) {
			out = append(out, n)
		}
	}
	sort.Strings(out) // virsh lists running domains first, by id
	return out
}

// volumes lists the volume names in pool starting with pfx.
func volumes(t *testing.T, pool, pfx string) []string {
	t.Helper()
	raw := mustVirsh(t, "vol-list", "--pool", pool)
	var out []string
	for _, line := range strings.Split(raw, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], pfx) {
			out = append(out, f[0])
		}
	}
	return out
}

func domState(t *testing.T, name string) string {
	t.Helper()
	return strings.TrimSpace(mustVirsh(t, "domstate", name))
}

type qemuImgInfo struct {
	Format            string `json:"format"`
	BackingFilename   string `json:"backing-filename"`
	BackingFileFormat string `json:"backing-filename-format"`
}

func imgInfo(t *testing.T, path string) qemuImgInfo {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info qemuImgInfo
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("decode qemu-img info: %v", err)
	}
	return info
}

func volPath(t *testing.T, pool, vol string) string {
	t.Helper()
	return strings.TrimSpace(mustVirsh(t, "vol-path", "--pool", pool, vol))
}

// Namespace is the ownership metadata namespace (hypervisors/libvirt).
const Namespace = "https://bigfleet-vm.dev/provider/v1"

// metadata returns the ownership element of the live (or config)
// definition.
func metadata(t *testing.T, name string, config bool) string {
	t.Helper()
	args := []string{"metadata", name, Namespace}
	if config {
		args = append(args, "--config")
	}
	return mustVirsh(t, args...)
}

// ensureDaemon starts libvirtd the way scripts/libvirt-up.sh does when it
// does not answer (a test that killed it may have failed half-way). t may
// be nil.
func ensureDaemon(t *testing.T) {
	if _, err := virsh("uri"); err == nil {
		return
	}
	if out, err := exec.Command("libvirtd", libvirtdArgs()...).CombinedOutput(); err != nil && t != nil {
		t.Logf("restart libvirtd: %v %s", err, out)
	}
	for i := 0; i < 300; i++ {
		if _, err := virsh("uri"); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	if t != nil {
		t.Errorf("libvirtd did not come back")
	}
}

// sweep destroys and undefines every domain and deletes every volume (in
// both test pools) of installation inst, and returns what it removed. t may
// be nil.
func sweep(t *testing.T, inst string) []string {
	pfx := prefix(inst)
	var removed []string
	logf := func(format string, args ...any) {
		if t != nil {
			t.Logf(format, args...)
		} else {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}
	}
	out, err := virsh("list", "--all", "--name")
	if err != nil {
		logf("sweep %s: %v", inst, err)
		return nil
	}
	for _, n := range strings.Fields(out) {
		if !strings.HasPrefix(n, pfx) {
			continue
		}
		_, _ = virsh("destroy", n)
		if _, err := virsh("undefine", n, "--managed-save"); err != nil {
			if _, err := virsh("undefine", n); err != nil {
				logf("sweep: undefine %s: %v", n, err)
			}
		}
		removed = append(removed, "domain "+n)
	}
	for _, pool := range []string{sub.Pool, sub.Pool2} {
		if pool == "" {
			continue
		}
		_, _ = virsh("pool-refresh", pool)
		raw, err := virsh("vol-list", "--pool", pool)
		if err != nil {
			logf("sweep: vol-list %s: %v", pool, err)
			continue
		}
		for _, line := range strings.Split(raw, "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || !strings.HasPrefix(f[0], pfx) {
				continue
			}
			if _, err := virsh("vol-delete", "--pool", pool, f[0]); err != nil {
				logf("sweep: vol-delete %s/%s: %v", pool, f[0], err)
			}
			removed = append(removed, "volume "+pool+"/"+f[0])
		}
	}
	return removed
}

// ---- guest agent, through virsh qemu-agent-command ----

// agent runs one QGA command on a domain and returns its "return" member.
func agent(name, execute string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": execute}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	out, err := virsh("qemu-agent-command", name, string(b), "--timeout", "20")
	if err != nil {
		return nil, err
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal([]byte(out), &reply); err != nil {
		return nil, fmt.Errorf("%s: decode %q: %w", execute, out, err)
	}
	return reply.Return, nil
}

// readGuestFile reads a whole file from the guest (guest-file-open/read/
// close). A missing file is an error containing "No such file".
func readGuestFile(name, path string) ([]byte, error) {
	raw, err := agent(name, "guest-file-open", map[string]string{"path": path, "mode": "r"})
	if err != nil {
		return nil, err
	}
	var h int
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, err
	}
	defer func() { _, _ = agent(name, "guest-file-close", map[string]int{"handle": h}) }()
	var data []byte
	for {
		raw, err := agent(name, "guest-file-read", map[string]int{"handle": h, "count": 1 << 20})
		if err != nil {
			return nil, err
		}
		var r struct {
			Count int    `json:"count"`
			Buf   []byte `json:"buf-b64"`
			EOF   bool   `json:"eof"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, err
		}
		data = append(data, r.Buf...)
		if r.EOF || r.Count == 0 {
			return data, nil
		}
	}
}

// writeGuestFile writes a small file in the guest and sets its mode.
func writeGuestFile(name, path string, data []byte, mode string) error {
	raw, err := agent(name, "guest-file-open", map[string]string{"path": path, "mode": "w"})
	if err != nil {
		return err
	}
	var h int
	if err := json.Unmarshal(raw, &h); err != nil {
		return err
	}
	if _, err := agent(name, "guest-file-write", map[string]any{"handle": h, "buf-b64": data}); err != nil {
		return err
	}
	if _, err := agent(name, "guest-file-close", map[string]int{"handle": h}); err != nil {
		return err
	}
	code, _, stderr, err := guestExec(name, "/bin/chmod", mode, path)
	if err == nil && code != 0 {
		err = fmt.Errorf("chmod %s exited %d: %s", path, code, stderr)
	}
	return err
}

// guestExec runs argv in the guest to exit (guest-exec, guest-exec-status).
func guestExec(name string, argv ...string) (int, string, string, error) {
	raw, err := agent(name, "guest-exec", map[string]any{"path": argv[0], "arg": argv[1:], "capture-output": true})
	if err != nil {
		return 0, "", "", err
	}
	var started struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &started); err != nil {
		return 0, "", "", err
	}
	for i := 0; i < 200; i++ {
		raw, err := agent(name, "guest-exec-status", map[string]int{"pid": started.PID})
		if err != nil {
			return 0, "", "", err
		}
		var st struct {
			Exited   bool   `json:"exited"`
			ExitCode int    `json:"exitcode"`
			Out      []byte `json:"out-data"`
			Err      []byte `json:"err-data"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return 0, "", "", err
		}
		if st.Exited {
			return st.ExitCode, string(st.Out), string(st.Err), nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, "", "", fmt.Errorf("guest-exec %v did not exit", argv)
}

// fakeKubectl stands in for kubectl in the tiny guest (which has none): it
// records its arguments so the test can check what Drain ran.
const fakeKubectl = `#!/bin/sh
echo "$*" >>/var/lib/bigfleet/kubectl.log
exit 0
`

// ---- plan (/debug/plan or provider plan --json) ----

// plan is the subset of the versioned JSON plan the suite reads.
type plan struct {
	FormatVersion string `json:"format_version"`
	Zones         []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Error  string `json:"error"`
	} `json:"zones"`
	Changes []struct {
		Machine string `json:"machine"`
		Zone    string `json:"zone"`
		State   string `json:"state"`
		Wait    string `json:"wait"`
		Fail    string `json:"fail"`
		Steps   []struct {
			ID     string `json:"id"`
			Action string `json:"action"`
			Target struct {
				Zone string `json:"zone"`
				Name string `json:"name"`
			} `json:"target"`
		} `json:"steps"`
	} `json:"changes"`
	Drift []struct {
		Machine string `json:"machine"`
		Zone    string `json:"zone"`
		VM      string `json:"vm"`
		Kind    string `json:"kind"`
		Policy  string `json:"policy"`
		Detail  string `json:"detail"`
	} `json:"drift"`
}

// currentPlan returns the running provider's plan: `provider plan --server
// <metrics> --json` when this build has it, else GET /debug/plan directly.
func (p *provider) currentPlan() (plan, string) {
	p.t.Helper()
	if pl, out, ok := p.runPlan("--server", p.MetricsURL(), "--json"); ok {
		return pl, "provider plan --server --json"
	} else {
		p.t.Logf("provider plan --server unusable here (%s); using GET /debug/plan", out)
	}
	var pl plan
	st, body := p.HTTPGet("/debug/plan")
	if st != http.StatusOK {
		p.t.Fatalf("/debug/plan: %d %s", st, body)
	}
	if err := json.Unmarshal([]byte(body), &pl); err != nil {
		p.t.Fatalf("decode /debug/plan: %v\n%s", err, body)
	}
	return pl, "/debug/plan"
}

// offlinePlan runs `provider plan --json` with the provider's own serve
// flags (read-only planning from the state file and the hosts). ok is false
// when this build has no usable plan subcommand.
func (p *provider) offlinePlan() (plan, string, bool) {
	return p.runPlan(append([]string{"--json"}, p.Argv()[1:]...)...)
}

func (p *provider) runPlan(args ...string) (plan, string, bool) {
	var pl plan
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"plan"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	if err != nil && code != 2 {
		return pl, fmt.Sprintf("exit %d: %s", code, firstLine(stderr.String()+stdout.String())), false
	}
	if err := json.Unmarshal(stdout.Bytes(), &pl); err != nil || pl.FormatVersion == "" {
		return pl, fmt.Sprintf("not a JSON plan: %v: %s", err, firstLine(stdout.String())), false
	}
	return pl, "", true
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
