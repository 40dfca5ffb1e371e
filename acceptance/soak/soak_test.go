//go:build soak

package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
	"github.com/bigfleet-vm/provider/internal/relay"
)

// settings are the soak's knobs (environment).
type settings struct {
	duration    time.Duration // SOAK_DURATION: chaos and churn (default 4m)
	workers     int           // SOAK_WORKERS (default 4)
	callTimeout time.Duration // SOAK_CALL_TIMEOUT: --libvirt-call-timeout (default 10s)
	seed        int64         // SOAK_SEED (default: the clock)
	report      string        // SOAK_REPORT: also write the summary there
}

// substrate is what scripts/libvirt-up.sh and sshd-up.sh exported.
type substrate struct {
	uri, pool, network, image, kernel, initrd, libvirtdArgs string
	tlsDir, tlsPort, sshUser, sshKey, knownHosts            string
	libsshPort, libsshPID, sshPort, sshPID                  string
}

func loadSettings(t *testing.T) (settings, substrate) {
	t.Helper()
	s := settings{duration: 4 * time.Minute, workers: 4, callTimeout: 10 * time.Second, seed: time.Now().UnixNano(), report: os.Getenv("SOAK_REPORT")}
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute {
			t.Fatalf("SOAK_DURATION=%q: want a duration of at least 1m", v)
		}
		s.duration = d
	}
	if v := os.Getenv("SOAK_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 32 {
			t.Fatalf("SOAK_WORKERS=%q: want 1 to 32", v)
		}
		s.workers = n
	}
	if v := os.Getenv("SOAK_CALL_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SOAK_CALL_TIMEOUT=%q: %v", v, err)
		}
		s.callTimeout = d
	}
	if v := os.Getenv("SOAK_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: %v", v, err)
		}
		s.seed = n
	}
	e := substrate{
		uri: os.Getenv("BIGFLEET_LIBVIRT_URI"), pool: os.Getenv("BIGFLEET_LIBVIRT_POOL"), network: os.Getenv("BIGFLEET_LIBVIRT_NETWORK"),
		image: os.Getenv("BIGFLEET_LIBVIRT_IMAGE"), kernel: os.Getenv("BIGFLEET_LIBVIRT_KERNEL"), initrd: os.Getenv("BIGFLEET_LIBVIRT_INITRD"),
		libvirtdArgs: os.Getenv("BIGFLEET_LIBVIRTD_ARGS"),
		tlsDir:       os.Getenv("BIGFLEET_TLS_DIR"), tlsPort: os.Getenv("BIGFLEET_TLS_PORT"),
		sshUser: os.Getenv("BIGFLEET_SSH_USER"), sshKey: os.Getenv("BIGFLEET_SSH_KEY"), knownHosts: os.Getenv("BIGFLEET_SSH_KNOWN_HOSTS"),
		libsshPort: os.Getenv("BIGFLEET_SSHD_LIBSSH_PORT"), libsshPID: os.Getenv("BIGFLEET_SSHD_LIBSSH_PID"),
		sshPort: os.Getenv("BIGFLEET_SSHD_SSH_PORT"), sshPID: os.Getenv("BIGFLEET_SSHD_SSH_PID"),
	}
	for k, v := range map[string]string{"BIGFLEET_LIBVIRT_URI": e.uri, "BIGFLEET_LIBVIRT_POOL": e.pool, "BIGFLEET_LIBVIRT_KERNEL": e.kernel,
		"BIGFLEET_TLS_DIR": e.tlsDir, "BIGFLEET_SSH_KEY": e.sshKey, "BIGFLEET_SSHD_SSH_PID": e.sshPID} {
		if v == "" {
			t.Fatalf("%s is not set: run the soak through scripts/soak.sh (make soak)", k)
		}
	}
	if e.network == "" {
		e.network = "user"
	}
	if e.libvirtdArgs == "" {
		e.libvirtdArgs = "-d --listen"
	}
	return s, e
}

// ---- findings ----

// findings collects what fails the soak, from any goroutine.
type findings struct {
	mu   sync.Mutex
	list []string
	// failed counts machines that went FAILED, by last_error class.
	failed map[string]int
}

func (f *findings) add(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.list) < 200 {
		f.list = append(f.list, fmt.Sprintf(time.Now().Format("15:04:05 ")+format, args...))
	}
}

func (f *findings) failedMachine(lastError string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := lastError
	if len(k) > 120 {
		k = k[:120] + "…"
	}
	f.failed[k]++
}

// ---- the provider under test ----

// soak is one run.
type soak struct {
	t       *testing.T
	set     settings
	sub     substrate
	rng     *rand.Rand
	binary  string
	inst    string
	p       *providertest.Provider
	rl      *relay.Relay
	zones   []string
	finds   *findings
	started time.Time

	mu sync.Mutex
	// cur is the current incarnation of the provider as the background
	// goroutines see it.
	pid     int
	metrics string
	// hist accumulates hypervisor_call_duration_seconds of ended
	// incarnations; last holds the current one's latest scrape.
	hist, last map[string]*histogram
	samples    [][]sample // per incarnation
	events     map[string]int
	cycles     map[string]int // per zone
	plans      int
	planTimes  []time.Duration
	// crashes counts libvirtd's exits that no chaos event caused;
	// crashLines keeps the first maxCrashLines of them, each with the last
	// line of its log at the time.
	crashes    int
	crashLines []string
}

// maxCrashLines bounds the crashes the summary spells out.
const maxCrashLines = 10

// sample is one reading of the provider's size.
type sample struct {
	at         time.Time
	rss        float64 // bytes
	goroutines float64
}

// histogram is one series of cumulative buckets.
type histogram struct {
	bounds []float64
	counts []uint64 // cumulative, same length as bounds; +Inf last
	total  uint64
}

func (h *histogram) add(o *histogram) {
	if h.bounds == nil {
		h.bounds = append([]float64(nil), o.bounds...)
		h.counts = make([]uint64, len(o.counts))
	}
	for i := range o.counts {
		if i < len(h.counts) {
			h.counts[i] += o.counts[i]
		}
	}
	h.total += o.total
}

// quantile interpolates within buckets as histogram_quantile does.
func (h *histogram) quantile(q float64) float64 {
	if h.total == 0 {
		return math.NaN()
	}
	rank := q * float64(h.total)
	lower, prev := 0.0, uint64(0)
	for i, c := range h.counts {
		if float64(c) >= rank {
			upper := h.bounds[i]
			if math.IsInf(upper, 1) {
				return lower
			}
			if c == prev {
				return upper
			}
			return lower + (upper-lower)*(rank-float64(prev))/float64(c-prev)
		}
		lower, prev = h.bounds[i], c
	}
	return lower
}

// max is the upper bound of the highest bucket with samples.
func (h *histogram) max() float64 {
	prev := uint64(0)
	top := 0.0
	for i, c := range h.counts {
		if c > prev {
			top = h.bounds[i]
		}
		prev = c
	}
	return top
}

// above counts samples above bound (bound must be a bucket bound).
func (h *histogram) above(bound float64) uint64 {
	for i, b := range h.bounds {
		if b >= bound {
			return h.total - h.counts[i]
		}
	}
	return 0
}

func TestSoak(t *testing.T) {
	set, sub := loadSettings(t)
	bin, cleanup, err := providertest.Build("bf-soak-bin-")
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	s := &soak{t: t, set: set, sub: sub, rng: rand.New(rand.NewSource(set.seed)), binary: bin,
		inst: fmt.Sprintf("soak-%04x", rand.New(rand.NewSource(set.seed)).Intn(1<<16)), finds: &findings{failed: map[string]int{}},
		hist: map[string]*histogram{}, last: map[string]*histogram{}, events: map[string]int{}, cycles: map[string]int{}}
	t.Logf("soak: %s, %d workers, --libvirt-call-timeout %s, seed %d, installation %s", set.duration, set.workers, set.callTimeout, set.seed, s.inst)
	s.rl, err = relay.New("127.0.0.1:" + sub.tlsPort)
	if err != nil {
		t.Fatal(err)
	}
	defer s.rl.Close()
	// Whatever happens, nothing of the installation outlives the soak.
	t.Cleanup(func() {
		s.ensureDaemon()
		if left := s.sweep(); len(left) > 0 {
			t.Logf("final sweep removed %v", left)
		}
	})
	s.start()
	s.run()
	s.finish()
}

// ---- substrate helpers ----

func virsh(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "virsh", args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (s *soak) virsh(args ...string) (string, error) {
	return virsh(append([]string{"-c", s.sub.uri}, args...)...)
}

func (s *soak) prefix() string { return "bf-" + s.inst + "-" }

// domains lists the installation's domains.
func (s *soak) domains() ([]string, error) {
	out, err := s.virsh("list", "--all", "--name")
	if err != nil {
		return nil, err
	}
	var got []string
	for _, n := range strings.Fields(out) {
		if strings.HasPrefix(n, s.prefix()) {
			got = append(got, n)
		}
	}
	return got, nil
}

// volumes lists the installation's volumes (identity tags included).
func (s *soak) volumes() ([]string, error) {
	_, _ = s.virsh("pool-refresh", s.sub.pool)
	out, err := s.virsh("vol-list", "--pool", s.sub.pool)
	if err != nil {
		return nil, err
	}
	var got []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], s.prefix()) {
			got = append(got, f[0])
		}
	}
	return got, nil
}

func (s *soak) sweep() []string {
	var removed []string
	doms, _ := s.domains()
	for _, d := range doms {
		_, _ = s.virsh("destroy", d)
		if _, err := s.virsh("undefine", d, "--managed-save"); err != nil {
			_, _ = s.virsh("undefine", d)
		}
		removed = append(removed, "domain "+d)
	}
	vols, _ := s.volumes()
	for _, v := range vols {
		_, _ = s.virsh("vol-delete", "--pool", s.sub.pool, v)
		removed = append(removed, "volume "+v)
	}
	return removed
}

func pidFrom(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	st := string(b)
	i := strings.LastIndexByte(st, ')')
	return i < 0 || i+2 >= len(st) || st[i+2] != 'Z'
}

// checkDaemon restarts a libvirtd that exited when no chaos event stopped
// it (seen once: libvirtd 9.0 died right after logging "unexpected
// incomplete domain callback" as a client went away), as systemd's
// Restart=on-failure would on a host, and records the exit for the
// summary: the provider's part is to come back once the daemon does.
func (s *soak) checkDaemon() {
	if pid := pidFrom("/run/libvirtd.pid"); pid != 0 && alive(pid) {
		return
	}
	last := "no log"
	if b, err := os.ReadFile("/var/log/libvirt/libvirtd.log"); err == nil {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		last = lines[len(lines)-1]
	}
	s.t.Logf("libvirtd exited on its own (last log line: %s); starting it again", last)
	s.mu.Lock()
	s.crashes++
	if len(s.crashLines) < maxCrashLines {
		s.crashLines = append(s.crashLines, time.Now().Format("15:04:05")+" after "+last)
	}
	s.mu.Unlock()
	s.ensureDaemon()
}

// ensureDaemon starts libvirtd when it does not answer.
func (s *soak) ensureDaemon() {
	if _, err := s.virsh("uri"); err == nil {
		return
	}
	_ = exec.Command("libvirtd", strings.Fields(s.sub.libvirtdArgs)...).Run()
	for i := 0; i < 300; i++ {
		if _, err := s.virsh("uri"); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---- provider ----

const instanceTypes = `{"tiny.1": {"vcpu": 1, "memory_mib": 256}}`

// slotsPerWorker bounds how many machines one worker may use: a FAILED
// machine is sticky, so its worker moves to the next slot.
const slotsPerWorker = 60

func (s *soak) start() {
	t := s.t
	dir := t.TempDir()
	s.zones = []string{"local", "tls", "ssh", "libssh"}
	uris := map[string]string{
		"local":  s.sub.uri,
		"tls":    "qemu+tls://127.0.0.1:" + s.rl.Port() + "/system?pkipath=" + filepath.Join(s.sub.tlsDir, "client"),
		"libssh": fmt.Sprintf("qemu+libssh://%s@127.0.0.1:%s/system?keyfile=%s&known_hosts=%s&known_hosts_verify=normal", s.sub.sshUser, s.sub.libsshPort, s.sub.sshKey, s.sub.knownHosts),
		"ssh":    fmt.Sprintf("qemu+ssh://%s@127.0.0.1:%s/system?keyfile=%s", s.sub.sshUser, s.sub.sshPort, s.sub.sshKey),
	}
	type offering struct {
		InstanceType string `json:"instance_type"`
		Zone         string `json:"zone"`
		Count        int    `json:"count"`
	}
	var connect, pools []string
	var offs []offering
	perZone := (s.set.workers + len(s.zones) - 1) / len(s.zones)
	for _, z := range s.zones {
		connect = append(connect, z+"="+uris[z])
		pools = append(pools, z+"="+s.sub.pool)
		offs = append(offs, offering{InstanceType: "tiny.1", Zone: z, Count: perZone * slotsPerWorker})
	}
	b, _ := json.Marshal(offs)
	types, offsFile := filepath.Join(dir, "types.json"), filepath.Join(dir, "offerings.json")
	if err := os.WriteFile(types, []byte(instanceTypes), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(offsFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(os.TempDir(), "bf-soak-"+s.inst+".log")
	t.Logf("provider log: %s", logFile)
	s.p = providertest.Start(t, s.binary, providertest.Options{
		Args: []string{"serve",
			"--connect", strings.Join(connect, ","), "--storage-pool", strings.Join(pools, ","),
			"--image", s.sub.image, "--network", s.sub.network, "--domain-type", "qemu",
			"--kernel", s.sub.kernel, "--initrd", s.sub.initrd, "--kernel-cmdline", "console=ttyS0 quiet panic=-1",
			"--instance-types", types, "--offerings", offsFile,
			"--state", filepath.Join(dir, "state"), "--installation-id", s.inst,
			"--reconcile-interval", "15s", "--log-level", "info",
			// Many one-vCPU guests on a 2-CPU host: allow that vCPU
			// overcommit, or the Create check (default warn) fails them.
			"--capacity-overcommit", "64",
			"--libvirt-call-timeout", s.set.callTimeout.String(),
			"--create-timeout", createTimeout.String(), "--configure-timeout", configureTimeout.String(),
			"--drain-timeout", drainTimeout.String(), "--delete-timeout", deleteTimeout.String(),
		},
		LogFile: logFile, ReadyTimeout: 2 * time.Minute,
	})
	s.launched()
	s.started = time.Now()
	s.waitZones("start", 2*time.Minute)
}

// Transition deadlines of the soak's provider; a machine still in a
// transition stuckAfter past its deadline is stuck.
const (
	createTimeout    = 4 * time.Minute
	configureTimeout = 4 * time.Minute
	drainTimeout     = 4 * time.Minute
	deleteTimeout    = 4 * time.Minute
	stuckAfter       = 90 * time.Second
)

// launched records the current incarnation for the background readers.
func (s *soak) launched() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pid, s.metrics = s.p.Pid(), s.p.MetricsURL()
	s.samples = append(s.samples, nil)
	s.last = map[string]*histogram{}
}

// current returns the incarnation's pid and metrics URL.
func (s *soak) current() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid, s.metrics
}

func httpGet(url string) (int, string, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// zoneHealth reads /readyz: zone -> "ok" or why not.
func (s *soak) zoneHealth() (map[string]string, error) {
	_, url := s.current()
	_, body, err := httpGet(url + "/readyz")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "zone "); ok {
			if name, st, ok := strings.Cut(rest, ": "); ok {
				out[name] = st
			}
		}
	}
	return out, nil
}

func (s *soak) allUp() bool {
	h, err := s.zoneHealth()
	if err != nil || len(h) != len(s.zones) {
		return false
	}
	for _, st := range h {
		if st != "ok" {
			return false
		}
	}
	return true
}

// waitZones waits until every zone is up; a zone not back within max after
// an event is a finding.
func (s *soak) waitZones(after string, max time.Duration) {
	deadline := time.Now().Add(max)
	for !s.allUp() {
		if time.Now().After(deadline) {
			h, err := s.zoneHealth()
			s.finds.add("zones not all up %s after %s: %v %v", max, after, h, err)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scrape reads /metrics: goroutines, and the call durations of this
// incarnation.
func (s *soak) scrape() {
	pid, url := s.current()
	_, body, err := httpGet(url + "/metrics")
	if err != nil {
		return
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		s.finds.add("unparsable /metrics: %v", err)
		return
	}
	smp := sample{at: time.Now(), rss: rss(pid)}
	if f := fams["go_goroutines"]; f != nil && len(f.Metric) > 0 {
		smp.goroutines = f.Metric[0].GetGauge().GetValue()
	}
	last := map[string]*histogram{}
	if f := fams["bigfleet_provider_hypervisor_call_duration_seconds"]; f != nil {
		for _, m := range f.Metric {
			last[seriesKey(m)] = toHistogram(m.GetHistogram())
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if pid != s.pid {
		return // a new incarnation started meanwhile
	}
	s.last = last
	s.samples[len(s.samples)-1] = append(s.samples[len(s.samples)-1], smp)
}

func seriesKey(m *dto.Metric) string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l["op"] + "|" + l["zone"] + "|" + l["procedure"]
}

func toHistogram(h *dto.Histogram) *histogram {
	out := &histogram{total: h.GetSampleCount()}
	for _, b := range h.GetBucket() {
		out.bounds = append(out.bounds, b.GetUpperBound())
		out.counts = append(out.counts, b.GetCumulativeCount())
	}
	out.bounds = append(out.bounds, math.Inf(1))
	out.counts = append(out.counts, h.GetSampleCount())
	return out
}

// rss is a process's resident set in bytes (0 if gone).
func rss(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// endIncarnation folds the current incarnation's last scrape into the
// totals (before a kill -9, and at the end).
func (s *soak) endIncarnation() {
	s.scrape()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, h := range s.last {
		if s.hist[k] == nil {
			s.hist[k] = &histogram{}
		}
		s.hist[k].add(h)
	}
	s.last = map[string]*histogram{}
}

// ---- chaos ----

// chaos is one disruption: do starts it and returns what undoes it (nil:
// nothing to undo).
type chaos struct {
	name   string
	weight int
	do     func() func()
}

func (s *soak) chaosEvents(killProvider bool) []chaos {
	evs := []chaos{
		{"libvirtd restart", 3, func() func() {
			pid := pidFrom("/run/libvirtd.pid")
			if pid == 0 {
				return nil
			}
			_ = syscall.Kill(pid, syscall.SIGTERM)
			for i := 0; alive(pid) && i < 300; i++ {
				time.Sleep(100 * time.Millisecond)
			}
			if alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(time.Duration(s.rng.Intn(3000)) * time.Millisecond)
			s.ensureDaemon()
			return nil
		}},
		{"tls port blocked", 2, func() func() {
			s.rl.Cut()
			time.Sleep(time.Duration(3+s.rng.Intn(10)) * time.Second)
			return func() {
				if err := s.rl.Restore(); err != nil {
					s.finds.add("restore the TLS relay: %v", err)
				}
			}
		}},
		{"tls path frozen", 2, func() func() {
			s.rl.Freeze()
			time.Sleep(time.Duration(3+s.rng.Intn(10)) * time.Second)
			return s.rl.Thaw
		}},
		{"ssh session killed", 2, func() func() { s.killSessions(s.sub.sshPID); return nil }},
		{"libssh session killed", 2, func() func() { s.killSessions(s.sub.libsshPID); return nil }},
	}
	if killProvider {
		evs = append(evs, chaos{"provider kill -9", 2, func() func() {
			s.endIncarnation()
			s.p.Restart()
			s.launched()
			return nil
		}})
	}
	return evs
}

// killSessions SIGKILLs the sessions (children) of one sshd, not the
// listener: the provider's ssh connection drops, a redial works.
func (s *soak) killSessions(pidFile string) {
	pid := pidFrom(pidFile)
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
		st := string(b)
		if f := strings.Fields(st[strings.LastIndexByte(st, ')')+2:]); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

func (s *soak) pick(evs []chaos) chaos {
	total := 0
	for _, e := range evs {
		total += e.weight
	}
	n := s.rng.Intn(total)
	for _, e := range evs {
		if n < e.weight {
			return e
		}
		n -= e.weight
	}
	return evs[0]
}

// ---- the run ----

func (s *soak) run() {
	ctx, cancel := context.WithCancel(context.Background())
	end := s.started.Add(s.set.duration)
	var wg sync.WaitGroup
	for i := 0; i < s.set.workers; i++ {
		w := &worker{s: s, id: i, zone: s.zones[i%len(s.zones)], base: (i / len(s.zones)) * slotsPerWorker}
		wg.Add(1)
		go func() { defer wg.Done(); w.loop(ctx, end) }()
	}
	dupDone := make(chan struct{})
	go func() { defer close(dupDone); s.watchDomains(ctx) }()
	// The provider is killed only in the first two thirds: the last third
	// is one incarnation, long enough to see RSS and goroutines flat
	// under the other disruptions.
	killUntil := s.started.Add(s.set.duration * 2 / 3)
	nextChaos := time.Now().Add(20 * time.Second)
	nextPlan := time.Now().Add(30 * time.Second)
	sampleTick := time.NewTicker(5 * time.Second)
	defer sampleTick.Stop()
	for time.Now().Before(end) {
		select {
		case <-sampleTick.C:
			s.scrape()
		case <-time.After(time.Second):
		}
		s.checkDaemon()
		now := time.Now()
		switch {
		case now.After(nextChaos):
			ev := s.pick(s.chaosEvents(now.Before(killUntil)))
			t0 := time.Now()
			s.t.Logf("chaos: %s", ev.name)
			if undo := ev.do(); undo != nil {
				undo()
			}
			s.waitZones(ev.name, 2*time.Minute)
			s.mu.Lock()
			s.events[ev.name]++
			s.mu.Unlock()
			s.t.Logf("chaos: %s survived, zones up again after %s", ev.name, time.Since(t0).Round(time.Millisecond))
			nextChaos = time.Now().Add(time.Duration(15+s.rng.Intn(25)) * time.Second)
		case now.After(nextPlan) && s.allUp():
			s.planCheck()
			nextPlan = time.Now().Add(time.Duration(30+s.rng.Intn(30)) * time.Second)
		}
	}
	s.t.Log("churn over: workers finish their machines")
	cancel()
	wg.Wait()
	<-dupDone
}

// planCheck runs an offline `provider plan --json` with the serve flags
// while every zone is up: a zone it reports unknown is a finding if /readyz
// still says up afterwards (the stall that started issue 16).
func (s *soak) planCheck() {
	args := append([]string{"plan", "--json"}, s.p.Argv()[1:]...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, s.binary, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	took := time.Since(t0)
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	if err != nil && code != 2 {
		if s.allUp() {
			s.finds.add("offline plan failed with every zone up (exit %d): %s", code, firstLine(errb.String()))
		}
		return
	}
	var pl struct {
		Zones []struct{ Name, Status, Error string } `json:"zones"`
	}
	if err := json.Unmarshal(out.Bytes(), &pl); err != nil {
		s.finds.add("offline plan printed no JSON plan: %v", err)
		return
	}
	s.mu.Lock()
	s.plans++
	s.planTimes = append(s.planTimes, took)
	s.mu.Unlock()
	for _, z := range pl.Zones {
		if z.Status != "ok" && s.allUp() {
			s.finds.add("offline plan reported healthy zone %s %s after %s: %s", z.Name, z.Status, took.Round(time.Millisecond), z.Error)
		}
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// vmKey is the machine part of a domain name: bf-<inst>-<id>-<hash>-c<N>
// without the cycle.
var cycleSuffix = regexp.MustCompile(`-c[0-9]+$`)

// watchDomains checks, every few seconds, that no machine has two
// domains.
func (s *soak) watchDomains(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(3 * time.Second):
		}
		doms, err := s.domains()
		if err != nil {
			continue // libvirtd restarting
		}
		seen := map[string][]string{}
		for _, d := range doms {
			k := cycleSuffix.ReplaceAllString(d, "")
			seen[k] = append(seen[k], d)
		}
		for _, ds := range seen {
			if len(ds) > 1 {
				sort.Strings(ds)
				s.finds.add("two domains for one machine: %v", ds)
			}
		}
	}
}

// ---- workers ----

type worker struct {
	s    *soak
	id   int
	zone string
	base int
	slot int
}

func (w *worker) machine() string { return fmt.Sprintf("%s/tiny.1/%03d", w.zone, w.base+w.slot) }

// step is one mutation: what is sent, the states allowed once it is
// acknowledged (anything else means the acknowledged mutation was lost),
// the state it settles in and its deadline.
type step struct {
	name    string
	call    func(ctx context.Context, c pb.CapacityProviderClient, id string) error
	through pb.MachineState
	to      pb.MachineState
	timeout time.Duration
	before  func(ctx context.Context, id string) error
}

// loop walks machines through Create, Configure, Drain and Delete until
// end, then brings the current machine back to SPECULATIVE.
func (w *worker) loop(ctx context.Context, end time.Time) {
	s := w.s
	steps := []step{
		{"Create", func(ctx context.Context, c pb.CapacityProviderClient, id string) error {
			_, err := c.Create(ctx, &pb.CreateRequest{MachineId: id})
			return err
		}, providertest.StCreating, providertest.StIdle, createTimeout, nil},
		{"Configure", func(ctx context.Context, c pb.CapacityProviderClient, id string) error {
			_, err := c.Configure(ctx, &pb.ConfigureRequest{MachineId: id, ClusterId: "soak-" + w.zone, BootstrapBlob: []byte("soak blob for " + id)})
			return err
		}, providertest.StConfiguring, providertest.StConfigured, configureTimeout, nil},
		{"Drain", func(ctx context.Context, c pb.CapacityProviderClient, id string) error {
			_, err := c.Drain(ctx, &pb.DrainRequest{MachineId: id})
			return err
		}, providertest.StDraining, providertest.StIdle, drainTimeout, w.installKubectl},
		{"Delete", func(ctx context.Context, c pb.CapacityProviderClient, id string) error {
			_, err := c.Delete(ctx, &pb.DeleteRequest{MachineId: id})
			return err
		}, providertest.StDeleting, providertest.StSpeculative, deleteTimeout, nil},
	}
	for w.slot < slotsPerWorker {
		if ctx.Err() != nil {
			return // between cycles the machine is SPECULATIVE
		}
		id := w.machine()
		ok, full := true, true
		for i := 0; i < len(steps); i++ {
			if ctx.Err() != nil && steps[i].name == "Configure" {
				// Past the end a machine just goes home: from IDLE,
				// straight to Delete.
				i, full = 2, false
				continue
			}
			if err := w.do(context.Background(), steps[i], id); err != nil {
				w.failedOrGiveUp(id, err)
				ok = false
				break
			}
		}
		if !ok {
			w.slot++ // FAILED is sticky: the next cycle uses a fresh slot
			continue
		}
		if full {
			s.mu.Lock()
			s.cycles[w.zone]++
			s.mu.Unlock()
		}
	}
	s.finds.add("worker %d ran out of slots (%d machines FAILED)", w.id, slotsPerWorker)
}

// errFailed is a machine that went FAILED (allowed: chaos can make an
// outcome unknown; the worker moves on to a fresh slot).
type errFailed struct{ lastError string }

func (e errFailed) Error() string { return "FAILED: " + e.lastError }

func (w *worker) failedOrGiveUp(id string, err error) {
	if f, ok := err.(errFailed); ok {
		w.s.finds.failedMachine(f.lastError)
		w.s.t.Logf("worker %d: %s FAILED: %s", w.id, id, f.lastError)
		return
	}
	w.s.finds.add("worker %d: %s: %v", w.id, id, err)
}

// client retries until the provider answers: it may be restarting.
func (w *worker) get(id string) (*pb.Machine, error) {
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := w.s.p.Client().Get(ctx, &pb.MachineRef{Id: id})
		cancel()
		if err == nil {
			return m, nil
		}
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unavailable && st.Code() != codes.DeadlineExceeded && st.Code() != codes.Canceled {
			return nil, err
		}
		if i > 600 {
			return nil, fmt.Errorf("Get %s: provider unavailable for minutes: %w", id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// do sends one mutation until it is acknowledged (a retry toward the same
// target is idempotent), then polls until the machine settles, checking
// on every poll that the acknowledged mutation is not lost and the
// machine is not stuck past the deadline.
func (w *worker) do(ctx context.Context, st step, id string) error {
	s := w.s
	if st.before != nil {
		if err := st.before(ctx, id); err != nil {
			return fmt.Errorf("before %s: %w", st.name, err)
		}
	}
	t0 := time.Now()
	for {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := st.call(cctx, s.p.Client(), id)
		cancel()
		if err == nil {
			break
		}
		code := status.Code(err)
		if code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled {
			if time.Since(t0) > 5*time.Minute {
				return fmt.Errorf("%s never acknowledged: %w", st.name, err)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		// Refused: a FAILED machine (sticky), or the mutation already
		// went through before a restart hid its answer.
		m, gerr := w.get(id)
		if gerr != nil {
			return gerr
		}
		switch m.GetState() {
		case providertest.StFailed:
			return errFailed{m.GetLastError()}
		case st.through, st.to:
		default:
			return fmt.Errorf("%s refused (%v) with the machine %s", st.name, err, m.GetState())
		}
		break
	}
	acked := time.Now()
	for {
		m, err := w.get(id)
		if err != nil {
			return err
		}
		switch m.GetState() {
		case st.to:
			return nil
		case providertest.StFailed:
			return errFailed{m.GetLastError()}
		case st.through:
			if time.Since(acked) > st.timeout+stuckAfter {
				s.finds.add("%s stuck in %s for %s (deadline %s)", id, m.GetState(), time.Since(acked).Round(time.Second), st.timeout)
				return fmt.Errorf("stuck in %s", m.GetState())
			}
		default:
			s.finds.add("%s acknowledged for %s, but the machine is %s: the mutation was lost", st.name, id, m.GetState())
			return fmt.Errorf("%s lost", st.name)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// fakeKubectl stands in for kubectl in the tiny guest (the drain runs
// kubectl cordon and drain).
const fakeKubectl = "#!/bin/sh\necho \"$*\" >>/var/lib/bigfleet/kubectl.log\nexit 0\n"

// installKubectl writes the fake kubectl into the machine's guest through
// the guest agent, out of band (virsh on the unix socket), retried while
// libvirtd restarts.
func (w *worker) installKubectl(ctx context.Context, id string) error {
	m, err := w.get(id)
	if err != nil {
		return err
	}
	if m.GetState() != providertest.StConfigured {
		return nil // not drainable now; the Drain step will say why
	}
	dom := strings.TrimPrefix(m.GetHost().GetRef(), w.zone+"/")
	var last error
	for i := 0; i < 60; i++ {
		if last = w.s.writeGuestFile(dom, "/usr/bin/kubectl", []byte(fakeKubectl)); last == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("install kubectl in %s: %w", dom, last)
}

func (s *soak) agent(dom, execute string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": execute}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	out, err := s.virsh("qemu-agent-command", dom, string(b), "--timeout", "20")
	if err != nil {
		return nil, err
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal([]byte(out), &reply); err != nil {
		return nil, err
	}
	return reply.Return, nil
}

func (s *soak) writeGuestFile(dom, path string, data []byte) error {
	raw, err := s.agent(dom, "guest-file-open", map[string]string{"path": path, "mode": "w"})
	if err != nil {
		return err
	}
	var h int
	if err := json.Unmarshal(raw, &h); err != nil {
		return err
	}
	if _, err := s.agent(dom, "guest-file-write", map[string]any{"handle": h, "buf-b64": data}); err != nil {
		return err
	}
	if _, err := s.agent(dom, "guest-file-close", map[string]int{"handle": h}); err != nil {
		return err
	}
	raw, err = s.agent(dom, "guest-exec", map[string]any{"path": "/bin/chmod", "arg": []string{"0755", path}})
	if err != nil {
		return err
	}
	var started struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &started); err != nil {
		return err
	}
	for i := 0; i < 100; i++ {
		raw, err := s.agent(dom, "guest-exec-status", map[string]int{"pid": started.PID})
		if err != nil {
			return err
		}
		var st struct {
			Exited   bool `json:"exited"`
			ExitCode int  `json:"exitcode"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return err
		}
		if st.Exited {
			if st.ExitCode != 0 {
				return fmt.Errorf("chmod exited %d", st.ExitCode)
			}
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("chmod did not exit")
}

// ---- the end ----

func (s *soak) finish() {
	t := s.t
	s.waitZones("the churn", 2*time.Minute)
	// FAILED machines' domains and volumes are reaped by the provider's
	// own passes; wait for it, then anything of the installation left is
	// a leak.
	deadline := time.Now().Add(4 * time.Minute)
	var doms, vols []string
	for {
		var derr, verr error
		doms, derr = s.domains()
		vols, verr = s.volumes()
		if derr == nil && verr == nil && len(doms) == 0 && len(vols) == 0 {
			break
		}
		if time.Now().After(deadline) {
			if len(doms) > 0 {
				s.finds.add("domains left at the end: %v", doms)
			}
			if len(vols) > 0 {
				s.finds.add("volumes left at the end: %v", vols)
			}
			break
		}
		time.Sleep(2 * time.Second)
	}
	s.endIncarnation()
	// Every RPC returns by its bound (plus a second): exactly, from the
	// adapter's own overrun log below; coarsely, from the buckets here.
	s.mu.Lock()
	for k, h := range s.hist {
		parts := strings.SplitN(k, "|", 3)
		if parts[0] != "rpc" {
			continue
		}
		limit := s.set.callTimeout
		switch parts[2] {
		case "QEMUDomainAgentCommand": // the agent's own wait on top
			limit = 2 * s.set.callTimeout
		case "StorageVolUpload": // UploadTimeout and the abort's grace
			limit = 3*s.set.callTimeout + 2*time.Second
		}
		if n := h.above((limit + time.Second).Seconds()); n > 0 {
			s.finds.add("%d %s calls took longer than their bound %s", n, parts[2], limit)
		}
	}
	s.mu.Unlock()
	if logs, err := os.ReadFile(filepath.Join(os.TempDir(), "bf-soak-"+s.inst+".log")); err == nil {
		if n := strings.Count(string(logs), "libvirt call overran its deadline"); n > 0 {
			s.finds.add("%d libvirt calls overran their deadline by more than 1s (see the provider log)", n)
		}
	}
	s.p.Kill()
	s.checkGrowth()
	report := s.summary()
	t.Log("\n" + report)
	fmt.Println(report)
	if s.set.report != "" {
		_ = os.WriteFile(s.set.report, []byte(report), 0o644)
	}
	s.finds.mu.Lock()
	defer s.finds.mu.Unlock()
	for _, f := range s.finds.list {
		t.Error(f)
	}
}

// checkGrowth fails on RSS or goroutines growing across the last
// incarnation (no kill -9 in the last third) after its first minute.
func (s *soak) checkGrowth() {
	s.mu.Lock()
	defer s.mu.Unlock()
	last := s.samples[len(s.samples)-1]
	var warm []sample
	for _, x := range last {
		if x.at.Sub(last[0].at) >= time.Minute && x.rss > 0 {
			warm = append(warm, x)
		}
	}
	if len(warm) < 6 {
		s.t.Logf("growth: only %d samples after warm-up in the last incarnation; not judged", len(warm))
		return
	}
	third := len(warm) / 3
	maxOf := func(xs []sample, f func(sample) float64) float64 {
		m := 0.0
		for _, x := range xs {
			m = max(m, f(x))
		}
		return m
	}
	g := func(x sample) float64 { return x.goroutines }
	r := func(x sample) float64 { return x.rss }
	g0, g1 := maxOf(warm[:third], g), maxOf(warm[len(warm)-third:], g)
	r0, r1 := maxOf(warm[:third], r), maxOf(warm[len(warm)-third:], r)
	if g1 > g0*1.5+100 {
		s.finds.add("goroutines grew from %.0f to %.0f over the last incarnation", g0, g1)
	}
	if r1 > r0*1.5+64<<20 {
		s.finds.add("RSS grew from %.1f MiB to %.1f MiB over the last incarnation", r0/(1<<20), r1/(1<<20))
	}
}

func (s *soak) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "SOAK SUMMARY (%s, %d workers, zones %v, --libvirt-call-timeout %s, seed %d)\n", s.set.duration, s.set.workers, s.zones, s.set.callTimeout, s.set.seed)
	total := 0
	var zs []string
	for z, n := range s.cycles {
		total += n
		zs = append(zs, fmt.Sprintf("%s=%d", z, n))
	}
	sort.Strings(zs)
	fmt.Fprintf(&b, "cycles completed (Create->Configure->Drain->Delete): %d (%s)\n", total, strings.Join(zs, " "))
	s.finds.mu.Lock()
	nf := 0
	var fl []string
	for k, n := range s.finds.failed {
		nf += n
		fl = append(fl, fmt.Sprintf("  %dx %s", n, k))
	}
	s.finds.mu.Unlock()
	sort.Strings(fl)
	fmt.Fprintf(&b, "machines FAILED (chaos made an outcome unknown): %d\n", nf)
	for _, l := range fl {
		b.WriteString(l + "\n")
	}
	var evs []string
	n := 0
	for e, c := range s.events {
		n += c
		evs = append(evs, fmt.Sprintf("%s=%d", e, c))
	}
	sort.Strings(evs)
	fmt.Fprintf(&b, "chaos events survived: %d (%s)\n", n, strings.Join(evs, ", "))
	fmt.Fprintf(&b, "libvirtd exits no chaos caused (restarted): %d\n", s.crashes)
	for _, c := range s.crashLines {
		fmt.Fprintf(&b, "  %s\n", c)
	}
	sort.Slice(s.planTimes, func(i, j int) bool { return s.planTimes[i] < s.planTimes[j] })
	if len(s.planTimes) > 0 {
		fmt.Fprintf(&b, "offline plans with every zone up: %d (max %s)\n", s.plans, s.planTimes[len(s.planTimes)-1].Round(time.Millisecond))
	} else {
		fmt.Fprintf(&b, "offline plans with every zone up: 0\n")
	}
	// Per procedure (RPCs), then per kind.
	type row struct {
		name          string
		n             uint64
		p50, p99, max float64
	}
	var rows, ops []row
	agg := map[string]*histogram{}
	for k, h := range s.hist {
		parts := strings.SplitN(k, "|", 3)
		var name string
		switch parts[0] {
		case "rpc":
			name = "rpc " + parts[2]
		case "probe":
			name = "probe (all zones)"
		default:
			name = parts[0] + " (all zones)"
		}
		if agg[name] == nil {
			agg[name] = &histogram{}
		}
		agg[name].add(h)
	}
	for name, h := range agg {
		r := row{name, h.total, h.quantile(0.5), h.quantile(0.99), h.max()}
		if strings.HasPrefix(name, "rpc ") {
			rows = append(rows, r)
		} else {
			ops = append(ops, r)
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	sort.Slice(ops, func(i, j int) bool { return ops[i].name < ops[j].name })
	fmt.Fprintf(&b, "%-44s %9s %10s %10s %10s\n", "calls by procedure", "count", "p50", "p99", "max <=")
	for _, r := range append(rows, ops...) {
		fmt.Fprintf(&b, "%-44s %9d %10s %10s %10s\n", r.name, r.n, secs(r.p50), secs(r.p99), secs(r.max))
	}
	first, lastS := sample{}, sample{}
	if len(s.samples) > 0 && len(s.samples[0]) > 0 {
		first = s.samples[0][0]
	}
	if l := s.samples[len(s.samples)-1]; len(l) > 0 {
		lastS = l[len(l)-1]
	}
	fmt.Fprintf(&b, "provider incarnations: %d (kill -9 survived: %d)\n", len(s.samples), len(s.samples)-1)
	fmt.Fprintf(&b, "RSS start %.1f MiB, end %.1f MiB; goroutines start %.0f, end %.0f\n", first.rss/(1<<20), lastS.rss/(1<<20), first.goroutines, lastS.goroutines)
	s.finds.mu.Lock()
	fmt.Fprintf(&b, "findings: %d\n", len(s.finds.list))
	s.finds.mu.Unlock()
	return b.String()
}

func secs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case math.IsInf(v, 1):
		return "+Inf"
	case v < 1:
		return fmt.Sprintf("%.1fms", v*1000)
	}
	return fmt.Sprintf("%.2fs", v)
}
