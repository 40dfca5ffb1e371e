//go:build integration

package libvirt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kdomanski/iso9660"
	"gopkg.in/yaml.v3"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/observed"
)

type qemuImgInfo struct {
	Format            string `json:"format"`
	VirtualSize       uint64 `json:"virtual-size"`
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

func TestIntegrationVolumes(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	ctx := ctxT(t, 2*time.Minute)
	poolDir := filepath.Join(e.State, "pool-a")
	// Observation reads the listing and metadata, never volume bytes
	// (issue 16: a download could wedge the connection): every RPC is
	// recorded, and no observation may stream.
	var mu sync.Mutex
	var streams []string
	h.ObserveRPCs(func(_, proc string, _ time.Duration, _ error) {
		if proc == "StorageVolDownload" || proc == "StorageVolUpload" {
			mu.Lock()
			streams = append(streams, proc)
			mu.Unlock()
		}
	})
	observe := func(t *testing.T) *observed.Zone {
		t.Helper()
		mu.Lock()
		before := len(streams)
		mu.Unlock()
		z, err := h.Observe(ctx, "a")
		if err != nil {
			t.Fatalf("Observe: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if got := streams[before:]; len(got) > 0 {
			t.Errorf("Observe streamed volume bytes: %v", got)
		}
		return z
	}

	tests := []struct {
		name, base, wantBackingFmt string
		minGiB                     int
		wantSize                   uint64
	}{
		{"qcow2-base", e.Image, "qcow2", 0, 64 << 20},
		{"raw-base", e.ImageRaw, "raw", 0, 32 << 20},
		{"min-capacity", e.Image, "qcow2", 2, 2 << 30},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMachine(h, "vol-"+tc.name)
			cleanupMachine(t, h, "a", e.Pool, m)
			spec := lvspec.OverlaySpec{Pool: e.Pool, Name: m.overlay, BaseImage: tc.base, MinCapacityGiB: tc.minGiB}
			for i := 0; i < 2; i++ { // the second call is an ensure
				if err := h.CreateOverlay(ctx, "a", spec); err != nil {
					t.Fatalf("CreateOverlay #%d: %v", i, err)
				}
			}
			got := imgInfo(t, filepath.Join(poolDir, m.overlay))
			want := qemuImgInfo{Format: "qcow2", VirtualSize: tc.wantSize,
				BackingFilename: filepath.Join(poolDir, tc.base), BackingFileFormat: tc.wantBackingFmt}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("overlay (-want +got):\n%s", d)
			}

			seed := lvspec.SeedSpec{Pool: e.Pool, Name: m.seed, InstanceID: "vol-" + tc.name, Hostname: m.name}
			for i := 0; i < 2; i++ {
				if err := h.CreateSeed(ctx, "a", seed); err != nil {
					t.Fatalf("CreateSeed #%d: %v", i, err)
				}
			}
			files := readISO(t, filepath.Join(poolDir, m.seed))
			var md map[string]string
			if err := yaml.Unmarshal([]byte(files["meta-data"]), &md); err != nil {
				t.Fatalf("meta-data %q: %v", files["meta-data"], err)
			}
			gotFiles := map[string]any{"user-data": files["user-data"], "meta-data": md}
			wantFiles := map[string]any{"user-data": "#cloud-config\n",
				"meta-data": map[string]string{"instance-id": "vol-" + tc.name, "local-hostname": m.name}}
			if d := cmp.Diff(wantFiles, gotFiles); d != "" {
				t.Errorf("seed ISO (-want +got):\n%s", d)
			}

			z := observe(t)
			var vols []observed.Volume
			for _, v := range z.Volumes {
				if v.Name == m.overlay || v.Name == m.seed {
					vols = append(vols, *v)
				}
			}
			wantVols := []observed.Volume{
				{Zone: "a", Pool: e.Pool, Name: m.seed, Format: "iso", Identity: lvspec.SeedIdentity(seed)},
				{Zone: "a", Pool: e.Pool, Name: m.overlay, Format: "qcow2", BackingFormat: tc.wantBackingFmt},
			}
			if m.seed > m.overlay {
				wantVols[0], wantVols[1] = wantVols[1], wantVols[0]
			}
			if d := cmp.Diff(wantVols, vols); d != "" {
				t.Errorf("observed volumes (-want +got):\n%s", d)
			}

			for _, v := range []string{m.overlay, m.seed, m.overlay} { // twice: missing = success
				if err := h.DeleteVolume(ctx, "a", e.Pool, v); err != nil {
					t.Fatalf("DeleteVolume %s: %v", v, err)
				}
				if _, err := os.Stat(filepath.Join(poolDir, v)); !os.IsNotExist(err) {
					t.Errorf("%s still on disk: %v", v, err)
				}
			}
			if _, err := os.Stat(filepath.Join(poolDir, tc.base)); err != nil {
				t.Errorf("base image gone: %v", err)
			}
		})
	}

	t.Run("errors", func(t *testing.T) {
		err := h.CreateOverlay(ctx, "a", lvspec.OverlaySpec{Pool: e.Pool, Name: "bf-x-missing-base.qcow2", BaseImage: "no-such-image"})
		if !errors.Is(err, hypervisors.ErrNotFound) {
			t.Errorf("missing base: got %v, want ErrNotFound", err)
		}
		err = h.CreateOverlay(ctx, "a", lvspec.OverlaySpec{Pool: "no-such-pool", Name: "bf-x.qcow2", BaseImage: e.Image})
		if !errors.Is(err, hypervisors.ErrNotFound) {
			t.Errorf("missing pool: got %v, want ErrNotFound", err)
		}
		if err := h.DeleteVolume(ctx, "a", e.Pool, e.Image); !errors.Is(err, hypervisors.ErrNotOwned) {
			t.Errorf("delete golden image: got %v, want ErrNotOwned", err)
		}
	})
}

func readISO(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open ISO: %v", err)
	}
	defer f.Close()
	img, err := iso9660.OpenImage(f)
	if err != nil {
		t.Fatalf("read ISO: %v", err)
	}
	if l, _ := img.Label(); l != "cidata" {
		t.Errorf("ISO label = %q, want cidata", l)
	}
	root, err := img.RootDir()
	if err != nil {
		t.Fatalf("ISO root: %v", err)
	}
	kids, err := root.GetChildren()
	if err != nil {
		t.Fatalf("ISO children: %v", err)
	}
	out := map[string]string{}
	for _, k := range kids {
		var b bytes.Buffer
		_, _ = b.ReadFrom(k.Reader())
		out[k.Name()] = b.String()
	}
	return out
}

// bootGuest creates overlay, seed and a direct-kernel-boot domain for the
// tiny guest, starts it and waits for the agent; it returns the time from
// start to the first successful ping.
func bootGuest(t *testing.T, h *Hypervisor, e itEnv, zone, pool string, m machine) time.Duration {
	t.Helper()
	ctx := ctxT(t, 3*time.Minute)
	cleanupMachine(t, h, zone, pool, m)
	if err := h.CreateOverlay(ctx, zone, lvspec.OverlaySpec{Pool: pool, Name: m.overlay, BaseImage: e.Image}); err != nil {
		t.Fatalf("CreateOverlay: %v", err)
	}
	if err := h.CreateSeed(ctx, zone, lvspec.SeedSpec{Pool: pool, Name: m.seed, InstanceID: m.marker.MachineID, Hostname: m.name}); err != nil {
		t.Fatalf("CreateSeed: %v", err)
	}
	spec := lvspec.DomainSpec{
		Name: m.name, VCPU: 1, MemoryMiB: 256, DomainType: "qemu", Pool: pool,
		Overlay: m.overlay, Seed: m.seed, Network: e.Network,
		Kernel: e.Kernel, Initrd: e.Initrd, Cmdline: "console=ttyS0 quiet panic=-1",
		Marker: m.marker,
	}
	if err := h.DefineDomain(ctx, zone, spec); err != nil {
		t.Fatalf("DefineDomain: %v", err)
	}
	tg := hypervisors.Target{Zone: zone, Name: m.name}
	t0 := time.Now()
	if err := h.Start(ctx, tg); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := h.SetAutostart(ctx, tg, true); err != nil {
		t.Fatalf("SetAutostart: %v", err)
	}
	for {
		err := h.AgentPing(ctx, tg)
		if err == nil {
			return time.Since(t0)
		}
		if !errors.Is(err, hypervisors.ErrAgentNotReady) {
			t.Fatalf("AgentPing: %v (want nil or ErrAgentNotReady)", err)
		}
		if ctx.Err() != nil {
			t.Fatalf("agent never came up: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestIntegrationGuestLifecycle(t *testing.T) {
	e := needEnv(t)
	if e.Kernel == "" {
		t.Fatal("no guest kernel in the environment")
	}
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	m := newMachine(h, "guest-1")
	tg := hypervisors.Target{Zone: "a", Name: m.name}

	// Before start the agent is not there.
	boot := bootGuest(t, h, e, "a", e.Pool, m)
	t.Logf("MEASURE start->agent ping ok: %s", boot.Round(time.Millisecond))
	ctx := ctxT(t, 3*time.Minute)

	vm, err := h.Lookup(ctx, tg)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	wantVM := &observed.VM{Zone: "a", Name: m.name, Marker: &m.marker, Power: observed.PowerRunning,
		VCPU: 1, MemoryMiB: 256, Autostart: true, Volumes: []string{m.overlay, m.seed}}
	if d := cmp.Diff(wantVM, vm); d != "" {
		t.Errorf("Lookup (-want +got):\n%s", d)
	}

	// Configure: write a 4 MiB blob, run the hook, read back what it got.
	blob := make([]byte, 4<<20)
	for i := range blob {
		blob[i] = byte(i*7 + i>>9)
	}
	sum := sha256.Sum256(blob)
	t0 := time.Now()
	if err := h.AgentWriteFile(ctx, tg, "/opt/bigfleet/bootstrap.blob", blob, 0o600); err != nil {
		t.Fatalf("AgentWriteFile: %v", err)
	}
	tWrite := time.Since(t0)
	res, err := h.AgentExec(ctx, tg, []string{"/opt/bigfleet/bootstrap", "cluster-a"})
	if err != nil {
		t.Fatalf("AgentExec bootstrap: %v", err)
	}
	t.Logf("MEASURE configure: write 4 MiB %s, + exec %s", tWrite.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	want := hypervisors.ExecResult{ExitCode: 0,
		Stdout: []byte(fmt.Sprintf("cluster=cluster-a sha256=%s size=%d mode=600\n", hex.EncodeToString(sum[:]), len(blob)))}
	if d := cmp.Diff(want, res); d != "" {
		t.Errorf("bootstrap result (-want +got):\n%s", d)
	}
	// Read back through a second exec what the hook recorded.
	res, err = h.AgentExec(ctx, tg, []string{"/bin/cat", "/var/lib/bigfleet/received/cluster"})
	if err != nil || string(res.Stdout) != "cluster-a" {
		t.Errorf("received cluster = %q, %v", res.Stdout, err)
	}
	// The blob is removed and a second remove is fine.
	for i := 0; i < 2; i++ {
		if err := h.AgentRemoveFile(ctx, tg, "/opt/bigfleet/bootstrap.blob"); err != nil {
			t.Fatalf("AgentRemoveFile #%d: %v", i, err)
		}
	}
	res, err = h.AgentExec(ctx, tg, []string{"/bin/sh", "-c", "ls /opt/bigfleet"})
	if err != nil || string(res.Stdout) != "bootstrap\n" {
		t.Errorf("after remove: ls = %q, %v", res.Stdout, err)
	}
	// A file in a directory that does not exist yet, small and empty.
	if err := h.AgentWriteFile(ctx, tg, "/run/bigfleet/new/dir/f", nil, 0o640); err != nil {
		t.Fatalf("AgentWriteFile new dir: %v", err)
	}
	res, _ = h.AgentExec(ctx, tg, []string{"/bin/stat", "-c", "%a %s", "/run/bigfleet/new/dir/f"})
	if string(res.Stdout) != "640 0\n" {
		t.Errorf("new file stat = %q", res.Stdout)
	}

	// A hook that fails.
	res, err = h.AgentExec(ctx, tg, []string{"/opt/bigfleet/bootstrap", "fail"})
	if err != nil {
		t.Fatalf("AgentExec failing hook: %v", err)
	}
	if res.ExitCode != 3 || !strings.Contains(string(res.Stderr), "refusing cluster fail") {
		t.Errorf("failing hook: exit %d stderr %q", res.ExitCode, res.Stderr)
	}
	// A drain-like exec that takes a while (exercises status polling).
	t0 = time.Now()
	res, err = h.AgentExec(ctx, tg, []string{"/bin/sh", "-c", "sleep 1; echo drained; echo warn >&2"})
	if err != nil || string(res.Stdout) != "drained\n" || string(res.Stderr) != "warn\n" {
		t.Errorf("drain exec = %+v, %v", res, err)
	}
	t.Logf("MEASURE drain exec (sleep 1): %s", time.Since(t0).Round(time.Millisecond))
	// A binary that does not exist.
	if _, err := h.AgentExec(ctx, tg, []string{"/no/such/binary"}); err == nil {
		t.Errorf("exec of a missing binary succeeded")
	}

	// Bind: the marker is rewritten live and in config.
	bound := m.marker
	bound.Cluster = "cluster-a"
	if err := h.SetMarker(ctx, tg, bound); err != nil {
		t.Fatalf("SetMarker: %v", err)
	}
	z, err := h.Observe(ctx, "a")
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	var got *observed.VM
	for _, v := range z.VMs {
		if v.Name == m.name {
			got = v
		}
	}
	if got == nil || got.Marker == nil || got.Marker.Cluster != "cluster-a" {
		t.Errorf("observed marker after SetMarker = %+v", got)
	}
	out, _ := exec.Command("virsh", "-c", e.URI, "metadata", m.name, Namespace, "--config").Output()
	if !strings.Contains(string(out), "cluster-a") {
		t.Errorf("config metadata lacks the cluster: %s", out)
	}

	// Stop gracefully (guest-shutdown through the agent), then tear down.
	t0 = time.Now()
	if err := h.Stop(ctx, tg, 20*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	t.Logf("MEASURE graceful stop: %s", time.Since(t0).Round(time.Millisecond))
	vm, err = h.Lookup(ctx, tg)
	if err != nil || vm.Power != observed.PowerStopped {
		t.Fatalf("after Stop: %+v, %v", vm, err)
	}
	if err := h.AgentPing(ctx, tg); err == nil {
		t.Errorf("AgentPing on a stopped domain succeeded")
	}
	if err := h.Stop(ctx, tg, time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := h.UndefineDomain(ctx, tg); err != nil {
			t.Fatalf("UndefineDomain #%d: %v", i, err)
		}
	}
	if _, err := h.Lookup(ctx, tg); !errors.Is(err, hypervisors.ErrNotFound) {
		t.Errorf("Lookup after undefine: %v, want ErrNotFound", err)
	}
	for _, v := range []string{m.overlay, m.seed} {
		if err := h.DeleteVolume(ctx, "a", e.Pool, v); err != nil {
			t.Fatalf("DeleteVolume %s: %v", v, err)
		}
	}
	z, err = h.Observe(ctx, "a")
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	for _, v := range z.Volumes {
		if v.Name == m.overlay || v.Name == m.seed {
			t.Errorf("volume %s still observed", v.Name)
		}
	}
	if _, err := os.Stat(filepath.Join(e.State, "pool-a", e.Image)); err != nil {
		t.Errorf("base image gone: %v", err)
	}
}

// A seed volume that was created but never uploaded (all zeros, what a
// crash between the two leaves) observes with no identity, both in the
// listing and when read directly; CreateSeed fills it and the next
// listing (which cached the volume) shows the identity (issue 12: it was
// trusted by name and attached as the NoCloud disk).
func TestIntegrationBlankSeed(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	ctx := ctxT(t, 2*time.Minute)
	m := newMachine(h, "blank-seed")
	cleanupMachine(t, h, "a", e.Pool, m)
	spec := lvspec.SeedSpec{Pool: e.Pool, Name: m.seed, InstanceID: "blank-seed", Hostname: m.name}
	img, err := buildSeed(spec)
	if err != nil {
		t.Fatal(err)
	}
	// The same size as the real seed, so only the content tells them apart.
	if out, err := exec.Command("virsh", "-c", e.URI, "vol-create-as", e.Pool, m.seed, fmt.Sprint(len(img)), "--format", "raw").CombinedOutput(); err != nil {
		t.Fatalf("vol-create-as: %v %s", err, out)
	}
	seedOf := func(label string) (listed, direct string) {
		t.Helper()
		z, err := h.Observe(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, v := range z.Volumes {
			if v.Name == m.seed {
				listed, found = v.Identity, true
			}
		}
		if !found {
			t.Fatalf("%s: seed volume not listed", label)
		}
		vs, err := h.ReadVolumes(ctx, "a", e.Pool, []string{m.seed, "bf-no-such-volume"})
		if err != nil || len(vs) != 1 {
			t.Fatalf("%s: ReadVolumes = %v, %v", label, vs, err)
		}
		return listed, vs[0].Identity
	}
	if l, d := seedOf("blank"); l != "" || d != "" {
		t.Errorf("blank seed identity: listed %q, direct %q, want none", l, d)
	}
	if err := h.CreateSeed(ctx, "a", spec); err != nil {
		t.Fatal(err)
	}
	want := lvspec.SeedIdentity(spec)
	if l, d := seedOf("uploaded"); l != want || d != want {
		t.Errorf("uploaded seed identity: listed %q, direct %q, want %q", l, d, want)
	}
	if files := readISO(t, filepath.Join(e.State, "pool-a", m.seed)); files["user-data"] != "#cloud-config\n" {
		t.Errorf("ISO after upload: %v", files)
	}
	// The identity travels in the name of an empty tag volume, which the
	// listing hides; a rebuild from other inputs replaces the tag, and
	// DeleteVolume takes it along.
	tags := func() []string {
		t.Helper()
		out, err := exec.Command("virsh", "-c", e.URI, "vol-list", "--pool", e.Pool).CombinedOutput()
		if err != nil {
			t.Fatalf("vol-list: %v %s", err, out)
		}
		var got []string
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], m.seed+".") {
				got = append(got, f[0])
			}
		}
		return got
	}
	if got := tags(); len(got) != 1 || !strings.Contains(got[0], want) {
		t.Errorf("identity tags %v, want one naming %s", got, want)
	}
	z, err := h.Observe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range z.Volumes {
		if strings.HasPrefix(v.Name, m.seed+".") {
			t.Errorf("the identity tag %s is observed as a volume", v.Name)
		}
	}
	other := spec
	other.InstanceID = "blank-seed-2"
	if err := h.CreateSeed(ctx, "a", other); err != nil {
		t.Fatal(err)
	}
	if l, d := seedOf("rebuilt"); l != lvspec.SeedIdentity(other) || d != l {
		t.Errorf("rebuilt seed identity: listed %q, direct %q, want %q", l, d, lvspec.SeedIdentity(other))
	}
	if got := tags(); len(got) != 1 {
		t.Errorf("identity tags after the rebuild: %v, want one", got)
	}
	if err := h.DeleteVolume(ctx, "a", e.Pool, m.seed); err != nil {
		t.Fatal(err)
	}
	if got := tags(); len(got) != 0 {
		t.Errorf("identity tags left after DeleteVolume: %v", got)
	}
}

// Markers keep every byte through the real daemon, in a definition and in
// metadata set afterwards, on a shut-off and on a running domain (issue 8
// item 12: a cluster id "c\x00\x01\x1b" came back as U+FFFD).
func TestIntegrationMarkerBytes(t *testing.T) {
	e := needEnv(t)
	h := newIT(t, e, ZoneURI{Zone: "a", URI: e.URI})
	ctx := ctxT(t, 2*time.Minute)
	m := newMachine(h, "marker-bytes")
	m.marker.MachineID = "marker-bytes \x01\xff<&>"
	m.marker.InstanceType = " padded "
	cleanupMachine(t, h, "a", e.Pool, m)
	if err := h.CreateOverlay(ctx, "a", lvspec.OverlaySpec{Pool: e.Pool, Name: m.overlay, BaseImage: e.Image}); err != nil {
		t.Fatal(err)
	}
	spec := smallSpec(e.Pool, m)
	spec.Seed = ""
	if err := h.DefineDomain(ctx, "a", spec); err != nil {
		t.Fatal(err)
	}
	tg := hypervisors.Target{Zone: "a", Name: m.name}
	check := func(label string, want observed.Marker) {
		t.Helper()
		vm, err := h.Lookup(ctx, tg)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		if d := cmp.Diff(&want, vm.Marker); d != "" {
			t.Errorf("%s: marker (-want +got):\n%s", label, d)
		}
	}
	check("defined", m.marker)
	bound := m.marker
	bound.Cluster = "c\x00\x01\x1b"
	if err := h.SetMarker(ctx, tg, bound); err != nil {
		t.Fatal(err)
	}
	check("bound while shut off", bound)
	if err := h.Start(ctx, tg); err != nil {
		t.Fatal(err)
	}
	bound.Cluster = "c2\x00\t\r\n"
	if err := h.SetMarker(ctx, tg, bound); err != nil {
		t.Fatal(err)
	}
	check("bound while running", bound)
	out, err := exec.Command("virsh", "-c", e.URI, "dumpxml", m.name).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`enc="base64"`)) && !bytes.Contains(out, []byte(`enc='base64'`)) {
		t.Errorf("dumpxml shows no base64-encoded marker field:\n%s", out)
	}
}
