//go:build integration

package libvirt

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

// oneZone is a provider with one zone "a" on the substrate's first pool.
func oneZone(count int, extra ...string) config {
	return config{connect: "a=" + sub.URI, pools: "a=" + sub.Pool,
		offerings: []offering{{InstanceType: "tiny.1", Zone: "a", Count: count}}, extra: extra}
}

// vmOf returns the single domain of the installation and checks that the
// machine's host ref names it.
func vmOf(t *testing.T, p *provider, m *pb.Machine) string {
	t.Helper()
	doms := domains(t, prefix(p.inst))
	if len(doms) != 1 {
		t.Fatalf("domains of %s = %v, want exactly one", p.inst, doms)
	}
	if ref := m.GetHost().GetRef(); ref != m.GetZone()+"/"+doms[0] {
		t.Errorf("host ref = %q, want %q", ref, m.GetZone()+"/"+doms[0])
	}
	return doms[0]
}

// checkVolumes checks the overlay and seed of dom in pool: both exist, and
// the overlay is a qcow2 backed by the pool's golden image with the backing
// format declared.
func checkVolumes(t *testing.T, pool, dom string) {
	t.Helper()
	got, tags := splitTags(volumes(t, pool, dom), dom)
	want := []string{dom + "-cidata.iso", dom + "-disk.qcow2"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("volumes of %s in %s (-want +got):\n%s", dom, pool, d)
		return
	}
	if len(tags) != 1 {
		t.Errorf("identity tags of %s's seed in %s: %v, want one", dom, pool, tags)
	}
	info := imgInfo(t, volPath(t, pool, dom+"-disk.qcow2"))
	wantInfo := qemuImgInfo{Format: "qcow2", BackingFilename: volPath(t, pool, sub.Image), BackingFileFormat: "qcow2"}
	if d := cmp.Diff(wantInfo, info); d != "" {
		t.Errorf("overlay qemu-img info (-want +got):\n%s", d)
	}
}

// splitTags separates the seed's identity tag volumes
// (<dom>-cidata.iso.<identity>.<bytes>, see hypervisors/libvirt) from the
// other volumes of a listing.
func splitTags(vols []string, dom string) (plain, tags []string) {
	for _, v := range vols {
		if strings.HasPrefix(v, dom+"-cidata.iso.") {
			tags = append(tags, v)
		} else {
			plain = append(plain, v)
		}
	}
	return plain, tags
}

func checkRunning(t *testing.T, dom string) {
	t.Helper()
	if st := domState(t, dom); st != "running" {
		t.Errorf("domain %s is %q, want running", dom, st)
	}
	if info := mustVirsh(t, "dominfo", dom); !strings.Contains(strings.Join(strings.Fields(info), " "), "Autostart: enable") {
		t.Errorf("domain %s autostart not enabled:\n%s", dom, info)
	}
}

// checkGone checks that dom and its volumes are gone from pool and that
// the golden image is kept.
func checkGone(t *testing.T, pool, dom string) {
	t.Helper()
	if _, err := virsh("dominfo", dom); err == nil {
		t.Errorf("domain %s still defined", dom)
	}
	if v := volumes(t, pool, dom); len(v) > 0 {
		t.Errorf("volumes left in %s: %v", pool, v)
	}
	if _, err := os.Stat(volPath(t, pool, sub.Image)); err != nil {
		t.Errorf("golden image gone: %v", err)
	}
}

// checkBinding checks the cluster in the ownership metadata, live and
// persistent ("" = no binding).
func checkBinding(t *testing.T, dom, inst, machine, cluster string) {
	t.Helper()
	for _, cfg := range []bool{false, true} {
		md := metadata(t, dom, cfg)
		if !strings.Contains(md, "<installation>"+inst+"</installation>") || !strings.Contains(md, "<machine-id>"+machine+"</machine-id>") {
			t.Errorf("metadata (config=%t) lacks the ownership marker:\n%s", cfg, md)
		}
		has := strings.Contains(md, "<cluster>")
		switch {
		case cluster == "" && has:
			t.Errorf("metadata (config=%t) still carries a binding:\n%s", cfg, md)
		case cluster != "" && !strings.Contains(md, "<cluster>"+cluster+"</cluster>"):
			t.Errorf("metadata (config=%t) lacks cluster %s:\n%s", cfg, cluster, md)
		}
	}
}

// Scenario 1: Create, Configure with a 5 MiB blob, Drain with zero and a
// positive grace, Delete, all through the binary's gRPC API on real
// domains. Not parallel, so the measured times are not skewed by other
// guests booting.
func TestLifecycle(t *testing.T) {
	p := startProvider(t, oneZone(1))
	const id = "a/tiny.1/000"

	// Create → IDLE.
	t0 := p.create(id)
	m := p.waitState(id, providertest.StIdle, 3*time.Minute)
	t.Logf("MEASURE Create→IDLE (define+start+TCG boot to agent ping): %s", time.Since(t0).Round(time.Millisecond))
	dom := vmOf(t, p, m)
	checkRunning(t, dom)
	checkVolumes(t, sub.Pool, dom)
	checkBinding(t, dom, p.inst, id, "")

	// Configure with a 5 MiB random blob → CONFIGURED.
	blob := make([]byte, 5<<20)
	_, _ = rand.Read(blob)
	sum := sha256.Sum256(blob)
	t0 = p.configure(id, "cluster-acc", blob)
	m = p.waitState(id, providertest.StConfigured, 3*time.Minute)
	t.Logf("MEASURE Configure (5 MiB blob) RPC→CONFIGURED: %s", time.Since(t0).Round(time.Millisecond))
	if m.GetCluster() != "cluster-acc" {
		t.Errorf("cluster = %q, want cluster-acc", m.GetCluster())
	}
	summary, err := readGuestFile(dom, "/var/lib/bigfleet/received/summary")
	if err != nil {
		t.Fatalf("read hook summary from the guest: %v", err)
	}
	wantSummary := fmt.Sprintf("cluster=cluster-acc sha256=%s size=%d mode=600\n", hex.EncodeToString(sum[:]), len(blob))
	if d := cmp.Diff(wantSummary, string(summary)); d != "" {
		t.Errorf("what the hook received (-want +got):\n%s", d)
	}
	if got, err := readGuestFile(dom, "/var/lib/bigfleet/received/cluster"); err != nil || string(got) != "cluster-acc" {
		t.Errorf("received cluster = %q, %v", got, err)
	}
	for _, f := range []string{"/opt/bigfleet/bootstrap.blob", "/opt/bigfleet/bootstrap.blob.bf-tmp"} {
		if _, err := readGuestFile(dom, f); err == nil || !strings.Contains(err.Error(), "No such file") {
			t.Errorf("%s after Configure: %v, want No such file", f, err)
		}
	}
	checkBinding(t, dom, p.inst, id, "cluster-acc")
	if strings.Contains(p.Log(), hex.EncodeToString(blob[:32])) {
		t.Errorf("provider log contains blob bytes")
	}

	// The tiny guest has no kubectl; give it one that records its args.
	if err := writeGuestFile(dom, "/usr/bin/kubectl", []byte(fakeKubectl), "0755"); err != nil {
		t.Fatalf("install fake kubectl: %v", err)
	}

	// Drain with grace 0 → IDLE, binding cleared.
	t0 = p.drain(id, 0)
	m = p.waitState(id, providertest.StIdle, 2*time.Minute)
	t.Logf("MEASURE Drain (grace 0) RPC→IDLE: %s", time.Since(t0).Round(time.Millisecond))
	if m.GetCluster() != "" {
		t.Errorf("cluster after drain = %q", m.GetCluster())
	}
	checkBinding(t, dom, p.inst, id, "")

	// Configure again (small blob), then Drain with a positive grace.
	p.configure(id, "cluster-acc-2", []byte("second"))
	p.waitState(id, providertest.StConfigured, 2*time.Minute)
	checkBinding(t, dom, p.inst, id, "cluster-acc-2")
	t0 = p.drain(id, 5)
	p.waitState(id, providertest.StIdle, 2*time.Minute)
	t.Logf("MEASURE Drain (grace 5) RPC→IDLE: %s", time.Since(t0).Round(time.Millisecond))
	checkBinding(t, dom, p.inst, id, "")
	kl, err := readGuestFile(dom, "/var/lib/bigfleet/kubectl.log")
	if err != nil {
		t.Fatalf("read kubectl log: %v", err)
	}
	wantKubectl := "cordon bigfleet-guest\n" +
		"drain bigfleet-guest --ignore-daemonsets --delete-emptydir-data --grace-period=0 --force\n" +
		"cordon bigfleet-guest\n" +
		"drain bigfleet-guest --ignore-daemonsets --delete-emptydir-data --grace-period=5 --timeout=65s\n"
	if d := cmp.Diff(wantKubectl, string(kl)); d != "" {
		t.Errorf("kubectl calls in the guest (-want +got):\n%s", d)
	}

	// Delete → SPECULATIVE: domain undefined, overlay and seed gone, base kept.
	t0 = p.delete(id)
	m = p.waitState(id, providertest.StSpeculative, 3*time.Minute)
	t.Logf("MEASURE Delete RPC→SPECULATIVE: %s", time.Since(t0).Round(time.Millisecond))
	if m.GetHost().GetRef() != "" {
		t.Errorf("host ref after delete = %q", m.GetHost().GetRef())
	}
	checkGone(t, sub.Pool, dom)
	if d := domains(t, prefix(p.inst)); len(d) > 0 {
		t.Errorf("domains left: %v", d)
	}

	// /metrics counts hypervisor Observe calls (one per zone per full
	// pass), not libvirt RPCs; the adapter's own per-RPC counter is
	// in-process only (see hypervisors/libvirt TestIntegrationObserveCalls200).
	_, body := p.HTTPGet("/metrics")
	t.Logf("MEASURE over the test: %v hypervisor observe calls, %v reconcile passes (1 zone)",
		providertest.Metric(body, "bigfleet_provider_hypervisor_calls_total", `op="observe"`),
		providertest.Metric(body, "bigfleet_provider_reconciles_total", ""))
}

// Scenario 2: a hook that exits non-zero fails the machine with a bounded,
// blob-free last_error; the failed machine's VM is reaped and Delete
// returns the slot.
func TestHookFails(t *testing.T) {
	t.Parallel()
	p := startProvider(t, oneZone(1))
	const id = "a/tiny.1/000"
	p.create(id)
	m := p.waitState(id, providertest.StIdle, 3*time.Minute)
	dom := vmOf(t, p, m)

	var blob bytes.Buffer
	for i := 0; blob.Len() < 256<<10; i++ {
		fmt.Fprintf(&blob, "BLOB-SECRET-LINE-%06d token=%s\n", i, randHex(8))
	}
	p.configure(id, "fail", blob.Bytes())
	m = p.waitState(id, providertest.StFailed, 3*time.Minute)
	le := m.GetLastError()
	t.Logf("last_error (%d bytes): %s", len(le), le)
	if len(le) == 0 || len(le) > 2048+8 {
		t.Errorf("last_error length %d, want 1..~2048", len(le))
	}
	for _, want := range []string{"exited 3", "refusing cluster fail"} {
		if !strings.Contains(le, want) {
			t.Errorf("last_error lacks %q", want)
		}
	}
	if strings.Contains(le, "BLOB-SECRET") || strings.Contains(p.Log(), "BLOB-SECRET") {
		t.Errorf("the blob leaked into last_error or the log")
	}
	// The hook did run with the blob, and the blob was removed afterwards
	// (unless the reaper already destroyed the VM).
	if summary, err := readGuestFile(dom, "/var/lib/bigfleet/received/summary"); err == nil {
		sum := sha256.Sum256(blob.Bytes())
		if want := fmt.Sprintf("cluster=fail sha256=%s size=%d mode=600\n", hex.EncodeToString(sum[:]), blob.Len()); string(summary) != want {
			t.Errorf("hook summary = %q, want %q", summary, want)
		}
		if _, err := readGuestFile(dom, "/opt/bigfleet/bootstrap.blob"); err == nil {
			t.Errorf("blob still in the guest after the failed hook")
		}
	} else {
		t.Logf("guest no longer readable (reaped already?): %v", err)
	}

	// FAILED on_demand machines have their VM reaped; the record stays FAILED.
	deadline := time.Now().Add(2 * time.Minute)
	for len(domains(t, prefix(p.inst))) > 0 || len(volumes(t, sub.Pool, prefix(p.inst))) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("failed machine's VM not reaped: domains %v volumes %v", domains(t, prefix(p.inst)), volumes(t, sub.Pool, prefix(p.inst)))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if st := p.get(id).GetState(); st != providertest.StFailed {
		t.Errorf("state after reaping = %s, want FAILED", st)
	}
	// FAILED is terminal in the BigFleet contract: Delete is refused with
	// Aborted and the record stays; the VM is already gone.
	_, err := p.c.Delete(rpcCtx(t), &pb.DeleteRequest{MachineId: id})
	if status.Code(err) != codes.Aborted {
		t.Errorf("Delete of a FAILED machine: %v, want Aborted", err)
	}
	if st := p.get(id).GetState(); st != providertest.StFailed {
		t.Errorf("state after Delete = %s, want FAILED", st)
	}
	checkGone(t, sub.Pool, dom)
}
