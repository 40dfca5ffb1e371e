package libvirt

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
	"github.com/kdomanski/iso9660"
	"gopkg.in/yaml.v3"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvuri"
	"github.com/bigfleet-vm/provider/jsonplan"
	"github.com/bigfleet-vm/provider/observed"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read golden (run with -update): %v", err)
	}
	if d := cmp.Diff(string(want), got); d != "" {
		t.Errorf("%s (-want +got):\n%s", name, d)
	}
}

var testMarker = observed.Marker{Installation: "inst-1", MachineID: "m/1 <&>", OpID: "op-9", InstanceType: "kvm.small"}

func TestDomainDefinitionGolden(t *testing.T) {
	base := lvspec.DomainSpec{Name: "bf-inst-1-m-1-abcd-c1", VCPU: 2, MemoryMiB: 4096, Pool: "default", DomainType: "kvm", Network: "br-net",
		Overlay: "bf-inst-1-m-1-abcd-c1-disk.qcow2", Seed: "bf-inst-1-m-1-abcd-c1-cidata.iso", Marker: testMarker}
	kernel := base
	kernel.DomainType, kernel.Network = "qemu", "user"
	kernel.Kernel, kernel.Initrd, kernel.Cmdline = "/boot/vmlinuz", "/boot/initrd.gz", "console=ttyS0 quiet"
	kernel.Seed = ""
	tests := []struct {
		name, file string
		spec       lvspec.DomainSpec
	}{
		{"network disk boot", "domain-network.xml", base},
		{"direct kernel boot user nic", "domain-kernel-user.xml", kernel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := domainDefinition(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, got+"\n")
			// Idempotence: what we write parses back to the spec's facts.
			d, err := parseDomain(got)
			if err != nil {
				t.Fatal(err)
			}
			m := testMarker
			wantVols := []string{tc.spec.Overlay}
			if tc.spec.Seed != "" {
				wantVols = append(wantVols, tc.spec.Seed)
			}
			if diff := cmp.Diff(&m, d.marker()); diff != "" {
				t.Errorf("marker round trip (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]any{tc.spec.Name, tc.spec.VCPU, tc.spec.MemoryMiB, wantVols},
				[]any{d.Name, d.VCPU, d.memoryMiB(), d.volumes()}); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDomainDefinitionInvalid(t *testing.T) {
	ok := lvspec.DomainSpec{Name: "bf-x", VCPU: 1, MemoryMiB: 64, Pool: "p", Overlay: "bf-x.qcow2", DomainType: "kvm", Marker: testMarker}
	tests := []struct {
		name string
		mut  func(*lvspec.DomainSpec)
	}{
		{"no name", func(s *lvspec.DomainSpec) { s.Name = "" }},
		{"no vcpu", func(s *lvspec.DomainSpec) { s.VCPU = 0 }},
		{"no overlay", func(s *lvspec.DomainSpec) { s.Overlay = "" }},
		{"bad type", func(s *lvspec.DomainSpec) { s.DomainType = "xen" }},
		{"no type", func(s *lvspec.DomainSpec) { s.DomainType = "" }},
		{"no marker", func(s *lvspec.DomainSpec) { s.Marker = observed.Marker{} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := ok
			tc.mut(&s)
			if _, err := domainDefinition(s); !errors.Is(err, hypervisors.ErrInvalid) {
				t.Errorf("got %v, want ErrInvalid", err)
			}
		})
	}
}

// Libvirt hands back metadata with its own prefix (or none); readers match
// by namespace only, and other namespaces are ignored.
func TestParseDomainMarker(t *testing.T) {
	tests := []struct {
		name, xml string
		want      *observed.Marker
	}{
		{"libvirt prefix", `<domain><name>d</name><metadata><bf:marker xmlns:bf="https://bigfleet-vm.dev/provider/v1"><bf:installation>i</bf:installation><bf:machine-id>m</bf:machine-id><bf:cluster>c</bf:cluster></bf:marker></metadata></domain>`,
			&observed.Marker{Installation: "i", MachineID: "m", Cluster: "c"}},
		{"other prefix unprefixed children", `<domain><metadata><x:marker xmlns:x="https://bigfleet-vm.dev/provider/v1"><installation>i</installation><machine-id>m</machine-id></x:marker></metadata></domain>`,
			&observed.Marker{Installation: "i", MachineID: "m"}},
		{"foreign namespace", `<domain><metadata><bf:marker xmlns:bf="https://example.com/other"><bf:installation>i</bf:installation><bf:machine-id>m</bf:machine-id></bf:marker></metadata></domain>`, nil},
		{"no metadata", `<domain><name>d</name></domain>`, nil},
		{"incomplete", `<domain><metadata><bf:marker xmlns:bf="https://bigfleet-vm.dev/provider/v1"><bf:installation>i</bf:installation></bf:marker></metadata></domain>`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := parseDomain(tc.xml)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, d.marker()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestMarkerBody(t *testing.T) {
	got, err := markerBody(testMarker)
	if err != nil {
		t.Fatal(err)
	}
	want := `<marker><installation>inst-1</installation><machine-id>m/1 &lt;&amp;&gt;</machine-id><op-id>op-9</op-id><instance-type>kvm.small</instance-type></marker>`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestVolumeDefinitionGolden(t *testing.T) {
	ov, err := overlayDefinition("bf-a-disk.qcow2", 40<<30, "/pool/golden.raw", "raw")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rawDefinition("bf-a-cidata.iso", 374784)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "volume-overlay.xml", ov+"\n")
	golden(t, "volume-raw.xml", raw+"\n")
}

func TestParseVolume(t *testing.T) {
	// As libvirt 9.0 prints a dir-pool overlay.
	x := `<volume type='file'><name>bf-a.qcow2</name><key>/p/bf-a.qcow2</key><capacity unit='bytes'>67108864</capacity>
<target><path>/p/bf-a.qcow2</path><format type='qcow2'/></target>
<backingStore><path>/p/golden.raw</path><format type='raw'/></backingStore></volume>`
	v, err := parseVolume(x)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{v.format, v.backingFormat, v.capacity, v.path}
	want := []any{"qcow2", "raw", uint64(64 << 20), "/p/bf-a.qcow2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestScaled(t *testing.T) {
	tests := []struct {
		v    uint64
		unit string
		def  uint64
		want uint64
	}{
		{1024, "", 1 << 10, 1 << 20},
		{7, "", 1, 7},
		{4194304, "KiB", 1, 4 << 30},
		{256, "MiB", 1, 256 << 20},
		{2, "G", 1, 2 << 30},
		{7, "bytes", 1 << 10, 7},
		{1, "MB", 1, 1000000},
	}
	for _, tc := range tests {
		if got := scaled(tc.v, tc.unit, tc.def); got != tc.want {
			t.Errorf("scaled(%d, %q, %d) = %d, want %d", tc.v, tc.unit, tc.def, got, tc.want)
		}
	}
}

// Every byte of every marker field survives the round trip through the
// XML the adapter writes and reads (issue 8: a cluster id with control
// characters came back as U+FFFD). Values XML can carry stay plain.
func TestMarkerRoundTripByteExact(t *testing.T) {
	values := []string{
		"c\x00\x01\x1b", "plain-id", "m/1 <&>\"'", " leading", "trailing ", "   ", "tab\there", "line\nbreak",
		"cr\r\n", "\xff\xfe invalid utf-8", "é ünïcödé 集群", "\u0085next-line", "\ufffe", "\x7f",
	}
	for _, v := range values {
		m := observed.Marker{Installation: "inst", MachineID: v, OpID: v, InstanceType: v, Cluster: v}
		spec := lvspec.DomainSpec{Name: "bf-x", VCPU: 1, MemoryMiB: 64, Pool: "p", Overlay: "bf-x.qcow2", DomainType: "qemu", Marker: m}
		def, err := domainDefinition(spec)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		d, err := parseDomain(def)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if diff := cmp.Diff(&m, d.marker()); diff != "" {
			t.Errorf("define round trip of %q (-want +got):\n%s", v, diff)
		}
		// SetMetadata's body, as libvirt hands it back under its prefix.
		body, err := markerBody(m)
		if err != nil {
			t.Fatal(err)
		}
		back := strings.Replace(body, "<marker>", `<marker xmlns="`+Namespace+`">`, 1)
		if got := parseMarker(back); cmp.Diff(&m, got) != "" {
			t.Errorf("metadata body round trip of %q:\n%s", v, cmp.Diff(&m, got))
		}
	}
	if body, _ := markerBody(observed.Marker{Installation: "inst", MachineID: "m-1"}); strings.Contains(body, "base64") {
		t.Errorf("a plain marker was encoded: %s", body)
	}
}

// The seed is a NoCloud ISO whose meta-data parses back to exactly the
// instance id and hostname given, whatever YAML would make of them
// unquoted.
func TestBuildSeed(t *testing.T) {
	tests := []struct {
		name     string
		spec     lvspec.SeedSpec
		userData string
	}{
		{"default user-data", lvspec.SeedSpec{Name: "bf-s", InstanceID: "m-1", Hostname: "bf-host"}, "#cloud-config\n"},
		{"given user-data, quoted id", lvspec.SeedSpec{Name: "bf-s", InstanceID: "a\"b: c", Hostname: "h", UserData: "#cloud-config\npackages: [jq]\n"},
			"#cloud-config\npackages: [jq]\n"},
		{"YAML look-alikes", lvspec.SeedSpec{Name: "bf-s", InstanceID: "yes", Hostname: "0x1F"}, "#cloud-config\n"},
		{"control characters", lvspec.SeedSpec{Name: "bf-s", InstanceID: "c\x00\x01\x1b\n- x", Hostname: "null"}, "#cloud-config\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vol, err := buildSeed(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if len(vol)%2048 != 0 {
				t.Fatalf("seed volume is %d bytes, want whole 2 KiB sectors", len(vol))
			}
			img, err := iso9660.OpenImage(bytes.NewReader(vol))
			if err != nil {
				t.Fatal(err)
			}
			if l, _ := img.Label(); l != "cidata" {
				t.Errorf("label %q, want cidata", l)
			}
			root, err := img.RootDir()
			if err != nil {
				t.Fatal(err)
			}
			kids, err := root.GetChildren()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, k := range kids {
				b, _ := io.ReadAll(k.Reader())
				got[k.Name()] = string(b)
			}
			if got["user-data"] != tc.userData {
				t.Errorf("user-data = %q, want %q", got["user-data"], tc.userData)
			}
			var md map[string]string
			if err := yaml.Unmarshal([]byte(got["meta-data"]), &md); err != nil {
				t.Fatalf("meta-data %q: %v", got["meta-data"], err)
			}
			if diff := cmp.Diff(map[string]string{"instance-id": tc.spec.InstanceID, "local-hostname": tc.spec.Hostname}, md); diff != "" {
				t.Errorf("meta-data %q (-want +got):\n%s", got["meta-data"], diff)
			}
		})
	}
	if _, err := buildSeed(lvspec.SeedSpec{Name: "bf-s"}); !errors.Is(err, hypervisors.ErrInvalid) {
		t.Errorf("empty seed: %v, want ErrInvalid", err)
	}
}

// A seed volume's identity is its identity tag's, from the listing, only
// when exactly one tag names it and records the volume's size: a volume
// without a tag (created, never uploaded), a replaced or resized volume,
// two tags and malformed or foreign tag names all read as "".
func TestSeedIdentity(t *testing.T) {
	spec := lvspec.SeedSpec{Name: "bf-i-m1-c1-cidata.iso", InstanceID: "m-1", Hostname: "h"}
	id := lvspec.SeedIdentity(spec)
	other := lvspec.SeedIdentity(lvspec.SeedSpec{InstanceID: "m-2", Hostname: "h"})
	const size = 374784
	tag := seedTag(spec.Name, id, size)
	if tag != spec.Name+"."+id+".374784" {
		t.Fatalf("tag name %q", tag)
	}
	tests := []struct {
		name     string
		listing  []string
		capacity uint64
		want     string
	}{
		{"intact", []string{spec.Name, tag}, size, id},
		{"no tag (never uploaded)", []string{spec.Name}, size, ""},
		{"volume replaced (size differs)", []string{spec.Name, tag}, size + 2048, ""},
		{"two tags", []string{spec.Name, tag, seedTag(spec.Name, other, size)}, size, ""},
		{"another seed's tag", []string{spec.Name, seedTag("bf-i-m2-c1-cidata.iso", id, size)}, size, ""},
		{"not hex", []string{spec.Name, spec.Name + ".seed1-0123456789abcdef0123456789abcdeX.374784"}, size, ""},
		{"short identity", []string{spec.Name, spec.Name + ".seed1-0123456789abcdef.374784"}, size, ""},
		{"other identity scheme", []string{spec.Name, spec.Name + ".seed2-" + strings.TrimPrefix(id, "seed1-") + ".374784"}, size, ""},
		{"size with a leading zero", []string{spec.Name, spec.Name + "." + id + ".0374784"}, size, ""},
		{"no size", []string{spec.Name, spec.Name + "." + id}, size, ""},
		{"trailing text", []string{spec.Name, tag + ".bak"}, size, ""},
	}
	for _, tc := range tests {
		if got := seedIdentity(seedTags(tc.listing)[spec.Name], tc.capacity); got != tc.want {
			t.Errorf("%s: identity %q, want %q", tc.name, got, tc.want)
		}
	}
	if _, ok := parseSeedTag(spec.Name); ok {
		t.Errorf("the seed volume itself parses as a tag")
	}
	if _, ok := parseSeedTag("bf-i-m1-c1-disk.qcow2." + id + ".5"); ok {
		t.Errorf("a tag of a non-seed volume parses")
	}
}

// TestValidateURIPolicy: the adapter applies the one libvirt URI policy
// (lvuri.Check), the rules --connect is checked with, so a URI the flags
// refuse is refused here too.
func TestValidateURIPolicy(t *testing.T) {
	tests := []struct {
		uri string
		ok  bool
	}{
		{"qemu:///system", true},
		{"qemu:///session", true},
		{"qemu:///system?socket=/run/x.sock", true},
		{"qemu+unix:///system?socket=/run/x.sock", true},
		{"test:///default", true},
		{"qemu+libssh://bf@host/system?keyfile=/k&known_hosts=/kh&known_hosts_verify=normal", true},
		{"qemu+libssh://bf@host/system?known_hosts_verify=ignore", false},
		{"qemu+libssh://bf@host/system?known_hosts_verify=auto", false},
		{"qemu+libssh2://bf@host/system?no_verify=1", false},
		{"qemu+ssh://bf@host/system?keyfile=/k", true},
		{"qemu+ssh://bf@host/system?known_hosts=/kh", false},
		{"qemu+ssh://bf@host/system?no_verify=1", false},
		{"qemu+tls://host/system?pkipath=/pki", true},
		{"qemu+tls://host/system?no_verify=1", false},
		{"qemu://host/system?no_verify=1", false},
		{"qemu+tcp://host/system", false},
		{"xen:///system", false},
		{"qemu+ext://host/system", false},
		{"/no/scheme", false},
		// The rules only the config copy had before the policy lived once.
		{"qemu:///foo", false},
		{"qemu://host/", false},
		{"test:///", false},
		{"qemu:system", false},
		{"qemu+libssh:///system", false},
		{"qemu+unix://host/system", false},
		{"qemu://host:port/system", false},
	}
	for _, tc := range tests {
		t.Run(tc.uri, func(t *testing.T) {
			err := Config{Installation: "i", Zones: []ZoneURI{{Zone: "a", URI: tc.uri}}}.Validate()
			if (err == nil) != tc.ok {
				t.Errorf("Validate = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, hypervisors.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if cerr := lvuri.Check(tc.uri); (cerr == nil) != tc.ok {
				t.Errorf("lvuri.Check = %v, want ok=%v", cerr, tc.ok)
			}
		})
	}
}

func TestValidateReportsEverything(t *testing.T) {
	err := Config{Zones: []ZoneURI{{Zone: "a", URI: "qemu+tcp://h/system"}, {Zone: "a", URI: "qemu:///system"}, {URI: "qemu:///system"}}}.Validate()
	if !errors.Is(err, hypervisors.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
	for _, want := range []string{"installation is empty", "plain TCP", "listed twice", "has no name"} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestClassify(t *testing.T) {
	le := func(code golibvirt.ErrorNumber, msg string) error {
		return golibvirt.Error{Code: uint32(code), Message: msg}
	}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"no domain", le(golibvirt.ErrNoDomain, "Domain not found"), hypervisors.ErrNotFound},
		{"no volume", le(golibvirt.ErrNoStorageVol, "Storage volume not found"), hypervisors.ErrNotFound},
		{"no pool", le(golibvirt.ErrNoStoragePool, "no pool"), hypervisors.ErrNotFound},
		{"vol exists", le(golibvirt.ErrStorageVolExist, "exists"), hypervisors.ErrExists},
		{"denied", le(golibvirt.ErrAccessDenied, "access denied"), hypervisors.ErrPermission},
		{"auth", le(golibvirt.ErrAuthFailed, "auth failed"), hypervisors.ErrPermission},
		{"agent", le(golibvirt.ErrAgentUnresponsive, "Guest agent is not responding: QEMU guest agent is not connected"), hypervisors.ErrAgentNotReady},
		{"unsupported", le(golibvirt.ErrNoSupport, "this function is not supported by the connection driver: virStorageVolUpload"), hypervisors.ErrUnsupported},
		{"invalid", le(golibvirt.ErrOperationInvalid, "domain is not running"), hypervisors.ErrInvalid},
		{"busy", le(golibvirt.ErrResourceBusy, "busy"), hypervisors.ErrTransient},
		{"io", io.ErrUnexpectedEOF, hypervisors.ErrTransient},
		// qemu's ENOMEM at start and a pool's ENOSPC: named, terminal.
		{"guest memory", le(golibvirt.ErrInternalError, "internal error: process exited while connecting to monitor: qemu-system-x86_64: cannot set up guest memory 'pc.ram': Cannot allocate memory"), hypervisors.ErrNoResources},
		{"pool space", le(golibvirt.ErrSystemError, "cannot allocate 21474836480 bytes in file '/var/lib/libvirt/images/v.qcow2': No space left on device"), hypervisors.ErrNoResources},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := classify("op", tc.err)
			if errors.Is(tc.want, hypervisors.ErrNoResources) && hypervisors.Retryable(got) {
				t.Errorf("classify = %v: retryable, want terminal", got)
			}
			if !errors.Is(got, tc.want) {
				t.Errorf("classify = %v, want %v", got, tc.want)
			}
			if !errors.Is(got, tc.err) {
				t.Errorf("classify lost the original error")
			}
		})
	}
	if classify("op", nil) != nil {
		t.Error("classify(nil) != nil")
	}
}

func TestAgentError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"not connected", classify("x", golibvirt.Error{Code: uint32(golibvirt.ErrAgentUnresponsive), Message: "QEMU guest agent is not connected"}), hypervisors.ErrAgentNotReady},
		{"timeout", classify("x", golibvirt.Error{Code: uint32(golibvirt.ErrAgentCommandTimeout), Message: "Guest agent command timed out"}), hypervisors.ErrAgentNotReady},
		{"message only", errors.New("Guest agent is not responding"), hypervisors.ErrAgentNotReady},
		{"missing file", classify("x", golibvirt.Error{Code: uint32(golibvirt.ErrInternalError), Message: "failed to open file '/x': No such file or directory"}), hypervisors.ErrNotFound},
	}
	for _, tc := range tests {
		if got := agentError(tc.err); !errors.Is(got, tc.want) {
			t.Errorf("%s: agentError = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestStateParam(t *testing.T) {
	ps := []golibvirt.TypedParam{{Field: "state.reason", Value: golibvirt.TypedParamValue{D: 1, I: int32(1)}},
		{Field: "state.state", Value: golibvirt.TypedParamValue{D: 1, I: int32(5)}}}
	if got := stateParam(ps); got != golibvirt.DomainShutoff {
		t.Errorf("stateParam = %v, want shutoff", got)
	}
	if got := stateParam(nil); got != golibvirt.DomainNostate {
		t.Errorf("stateParam(nil) = %v", got)
	}
}

// New never dials synchronously: it returns while the first dial of a
// zone hangs (the zone reports "connecting"), and a zone on a dead socket
// is unreachable and reported by ZoneHealth; an unknown zone is
// ErrInvalid. (Speed is a benchmark's business: BenchmarkNew.)
func TestNewDoesNotBlockOnDeadZone(t *testing.T) {
	dir := t.TempDir()
	// A socket that accepts and never answers: the dial hangs in the
	// libvirt handshake.
	hang, err := net.Listen("unix", filepath.Join(dir, "hang.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer hang.Close()
	go func() {
		for {
			c, err := hang.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	sock := filepath.Join(dir, "none.sock")
	h, err := New(Config{Installation: "i", Zones: []ZoneURI{
		{Zone: "dead", URI: "qemu:///system?socket=" + sock},
		{Zone: "hung", URI: "qemu:///system?socket=" + hang.Addr().String()},
	}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, DialTimeout: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// New has returned although the hung zone's dial cannot finish.
	if err := h.ZoneHealth()["hung"]; !errors.Is(err, hypervisors.ErrUnreachable) || !strings.Contains(err.Error(), "connecting") {
		t.Errorf("ZoneHealth[hung] = %v, want unreachable: connecting", err)
	}
	select {
	case <-h.zones["hung"].ready:
		t.Error("the hung zone's first dial finished")
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	select {
	case <-h.zones["dead"].ready:
	case <-ctx.Done():
		t.Fatal("the dead zone's first dial never finished")
	}
	z, err := h.Observe(ctx, "dead")
	if !errors.Is(err, hypervisors.ErrUnreachable) {
		t.Errorf("Observe: %v, want ErrUnreachable", err)
	}
	if z == nil || z.Status != observed.StatusUnknown {
		t.Errorf("zone = %+v, want StatusUnknown", z)
	}
	if err := h.ZoneHealth()["dead"]; !errors.Is(err, hypervisors.ErrUnreachable) || !strings.Contains(err.Error(), "down since") {
		t.Errorf("ZoneHealth = %v, want unreachable: down since ...", err)
	} else if strings.Contains(err.Error(), "zone dead") {
		// /readyz prints "zone <name>: <health>"; the health must not
		// name the zone again.
		t.Errorf("ZoneHealth names the zone itself: %v", err)
	}
	if _, err := h.Observe(ctx, "nope"); !errors.Is(err, hypervisors.ErrInvalid) {
		t.Errorf("unknown zone: %v, want ErrInvalid", err)
	}
	// Another vocabulary's steps are not offered at all: the executor
	// answers a step of another hypervisor with ErrUnsupported.
	if _, err := h.Apply(ctx, hypervisors.Target{Zone: "z"}, foreignStep{}); !errors.Is(err, hypervisors.ErrUnsupported) {
		t.Errorf("another hypervisor's step on the libvirt adapter: %v, want ErrUnsupported", err)
	}
}

// foreignStep is a step of another hypervisor's vocabulary (a room never
// imports another room's, so it is made here).
type foreignStep struct{}

func (foreignStep) Info() hypervisors.ActionInfo {
	return hypervisors.ActionInfo{Name: "delete-vm", Effect: hypervisors.EffectDestroy}
}

func (foreignStep) PlanJSON(*jsonplan.Params) {}

// A call that never answers times out, and the connection is marked broken
// so that the background loop redials.
func TestCallTimeoutMarksBroken(t *testing.T) {
	cfg := Config{CallTimeout: 50 * time.Millisecond}
	cfg.defaults()
	var calls = new(atomicCounter)
	z := newZoneConn("z", nil, &cfg, nil, &calls.Int64, new(atomic.Int64))
	z.lv = &golibvirt.Libvirt{}
	z.gen = 1
	block := make(chan struct{})
	defer close(block)
	err := z.call(context.Background(), "hang", 0, func(*golibvirt.Libvirt) error { <-block; return nil })
	if !errors.Is(err, hypervisors.ErrTransient) {
		t.Fatalf("got %v, want ErrTransient", err)
	}
	select {
	case <-z.broken:
	default:
		t.Error("connection not marked broken")
	}
	if calls.Load() != 1 {
		t.Errorf("calls = %d, want 1", calls.Load())
	}
}

type atomicCounter struct{ atomic.Int64 }

// BenchmarkNew measures New with a zone whose daemon never answers (New
// must not wait for any dial).
func BenchmarkNew(b *testing.B) {
	sock := filepath.Join(b.TempDir(), "none.sock")
	cfg := Config{Installation: "i", Zones: []ZoneURI{{Zone: "dead", URI: "qemu:///system?socket=" + sock}}}
	for b.Loop() {
		h, err := New(cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = h.Close()
		b.StartTimer()
	}
}
