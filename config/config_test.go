package config

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvuri"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/inventory"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const (
	seedConnect = "rack1=qemu+libssh://bigfleet@host-a/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal,rack2=qemu+libssh://bigfleet@host-b/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal"
	rack1URI    = "qemu+libssh://bigfleet@host-a/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal"
	rack2URI    = "qemu+libssh://bigfleet@host-b/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal"
)

// The "minimal production invocation" of the libvirt configuration doc.
var libvirtSeedArgs = []string{
	"--provider", "libvirt-dc1",
	"--connect", seedConnect,
	"--image", "ubuntu-24.04.qcow2",
	"--storage-pool", "default", "--network", "default",
	"--offerings", "/etc/bigfleet/offerings.json",
	"--state", "/var/lib/bigfleet-libvirt/state.json",
	"--tls-cert", "server.pem", "--tls-key", "server-key.pem", "--tls-ca", "client-ca.pem",
}

// The "minimal production invocation" of the Proxmox configuration doc.
var proxmoxSeedArgs = []string{
	"--provider", "proxmox-dc1",
	"--proxmox-api-url", "https://pve1.example.internal:8006/api2/json",
	"--proxmox-token-id", "bigfleet@pve!autoscaler",
	"--proxmox-token-file", "/etc/bigfleet/proxmox-token/token",
	"--proxmox-ca-file", "/etc/pve/pve-root-ca.pem",
	"--proxmox-pool", "bigfleet",
	"--nodes", "pve1,pve2,pve3",
	"--template-vmid", "9000",
	"--offerings", "/etc/bigfleet/offerings.json",
	"--state", "/var/lib/bigfleet-proxmox/state.json",
	"--tls-cert", "server.pem", "--tls-key", "server-key.pem", "--tls-ca", "client-ca.pem",
}

// ignoreBulk leaves the catalog, offerings and slots to their own checks.
var ignoreBulk = cmpopts.IgnoreFields(Config{}, "Catalog", "Offerings", "Slots", "Certs", "CAWarnings")

func TestSeedInvocations(t *testing.T) {
	f := newFiles(t)
	lvCatalog := inventory.Builtin(inventory.CatalogRules{Prefix: "kvm."})
	pxCatalog := inventory.Builtin(inventory.CatalogRules{Prefix: "pve.", DefaultSource: 9000})
	pricing := inventory.Pricing{PerVCPUHour: 0.0030, PerGiBHour: 0.0008}
	tests := []struct {
		name      string
		args      []string
		want      *Config
		wantSlots int
		firstSlot string
	}{
		{
			name: "libvirt minimal production invocation",
			args: f.expand(libvirtSeedArgs, f.lvOfferings),
			want: &Config{
				Hypervisor: "libvirt", Backend: "libvirt", Provider: "libvirt-dc1",
				Addr: ":9000", MetricsAddr: ":9090", Reflection: true,
				TLS:       TLS{Cert: f.serverCert, Key: f.serverKey, CA: f.clientCA},
				LogFormat: "text", LogLevel: slog.LevelInfo, StatePath: "/var/lib/bigfleet-libvirt/state.json",
				ReconcileInterval: 2 * time.Minute,
				Timeouts:          Timeouts{Create: 5 * time.Minute, Configure: 8 * time.Minute, Drain: 15 * time.Minute, Delete: 5 * time.Minute},
				Zones:             []string{"rack1", "rack2"},
				Pricing:           pricing,
				Plugin: &libvirt.Settings{
					Connect: []lvuri.ZoneURI{{Zone: "rack1", URI: rack1URI}, {Zone: "rack2", URI: rack2URI}},
					Image:   "ubuntu-24.04.qcow2", StoragePool: "default", Network: "default", DomainType: "kvm",
					CallTimeout: 10 * time.Second, CapacityType: inventory.OnDemand,
				},
				MaxConcurrentPerZone: 8, ShutdownGrace: 30 * time.Second, RepairTimeout: 2 * time.Minute, RepairAttempts: 5,
				HistoryEvents: 50, HistoryTotal: 500000, HistoryRetention: 24 * time.Hour,
				CapacityCheck: "warn", CapacityOvercommit: 1,
			},
			wantSlots: 12,
			firstSlot: "rack1/kvm.small/000",
		},
		{
			name: "proxmox minimal production invocation",
			args: f.expand(proxmoxSeedArgs, f.pxOfferings),
			want: &Config{
				Hypervisor: "proxmox", Backend: "proxmox", Provider: "proxmox-dc1",
				Addr: ":9000", MetricsAddr: ":9090", Reflection: true,
				TLS:       TLS{Cert: f.serverCert, Key: f.serverKey, CA: f.clientCA},
				LogFormat: "text", LogLevel: slog.LevelInfo, StatePath: "/var/lib/bigfleet-proxmox/state.json",
				ReconcileInterval: 2 * time.Minute,
				Timeouts:          Timeouts{Create: 8 * time.Minute, Configure: 8 * time.Minute, Drain: 15 * time.Minute, Delete: 5 * time.Minute},
				Zones:             []string{"pve1", "pve2", "pve3"},
				Pricing:           pricing,
				Plugin: &proxmox.Settings{
					APIURL: "https://pve1.example.internal:8006/api2/json", TokenID: "bigfleet@pve!autoscaler",
					TokenSecret: tokenSecret, CAFile: f.pveCA, Pool: "bigfleet", Nodes: []string{"pve1", "pve2", "pve3"},
					TemplateVMID: 9000, BootstrapPath: "/run/bigfleet-bootstrap", BootstrapExec: []string{"/bin/sh"}, PollInterval: time.Second,
				},
				MaxConcurrentPerZone: 8, ShutdownGrace: 30 * time.Second, RepairTimeout: 2 * time.Minute, RepairAttempts: 5,
				HistoryEvents: 50, HistoryTotal: 500000, HistoryRetention: 24 * time.Hour,
				CapacityCheck: "warn", CapacityOvercommit: 1,
			},
			wantSlots: 12,
			firstSlot: "pve1/pve.medium/000",
		},
		{
			name: "deploy doc smoke test, with the fake requested explicitly",
			args: []string{"--seed-count", "32", "--addr", ":9000", "--metrics-addr", ":9090", "--use-fake-backend"},
			want: &Config{
				Hypervisor: "libvirt", Backend: BackendFake, Provider: "libvirt",
				Addr: ":9000", MetricsAddr: ":9090", MetricsAddrExplicit: true, Reflection: true,
				LogFormat: "text", LogLevel: slog.LevelInfo, ReconcileInterval: 2 * time.Minute,
				Timeouts:             Timeouts{Create: 5 * time.Minute, Configure: 8 * time.Minute, Drain: 15 * time.Minute, Delete: 5 * time.Minute},
				Zones:                []string{"local-a", "local-b"},
				Pricing:              pricing,
				Plugin:               &libvirt.Settings{StoragePool: "default", Network: "default", DomainType: "kvm", CallTimeout: 10 * time.Second, CapacityType: inventory.OnDemand},
				MaxConcurrentPerZone: 8, ShutdownGrace: 30 * time.Second, RepairTimeout: 2 * time.Minute, RepairAttempts: 5,
				HistoryEvents: 50, HistoryTotal: 500000, HistoryRetention: 24 * time.Hour,
				CapacityCheck: "warn", CapacityOvercommit: 1,
			},
			wantSlots: 32,
			firstSlot: "local-a/kvm.large/000",
		},
		{
			name: "proxmox doc fake invocation",
			args: []string{"--hypervisor", "proxmox", "--seed-count", "32", "--use-fake-backend"},
			want: &Config{
				Hypervisor: "proxmox", Backend: BackendFake, Provider: "proxmox",
				Addr: ":9000", MetricsAddr: ":9090", Reflection: true,
				LogFormat: "text", LogLevel: slog.LevelInfo, ReconcileInterval: 2 * time.Minute,
				Timeouts:             Timeouts{Create: 8 * time.Minute, Configure: 8 * time.Minute, Drain: 15 * time.Minute, Delete: 5 * time.Minute},
				Zones:                []string{"pve-a", "pve-b"},
				Pricing:              pricing,
				Plugin:               &proxmox.Settings{TemplateVMID: 9000, BootstrapPath: "/run/bigfleet-bootstrap", BootstrapExec: []string{"/bin/sh"}, PollInterval: time.Second},
				MaxConcurrentPerZone: 8, ShutdownGrace: 30 * time.Second, RepairTimeout: 2 * time.Minute, RepairAttempts: 5,
				HistoryEvents: 50, HistoryTotal: 500000, HistoryRetention: 24 * time.Hour,
				CapacityCheck: "warn", CapacityOvercommit: 1,
			},
			wantSlots: 32,
			firstSlot: "pve-a/pve.large/000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parse(tt.args, io.Discard)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, ignoreBulk, ignoreResolved); diff != "" {
				t.Errorf("Config (-want +got):\n%s", diff)
			}
			wantCatalog := lvCatalog
			if tt.want.Hypervisor == "proxmox" {
				wantCatalog = pxCatalog
			}
			if diff := cmp.Diff(wantCatalog, got.Catalog); diff != "" {
				t.Errorf("Catalog (-want +got):\n%s", diff)
			}
			if len(got.Slots) != tt.wantSlots || got.Slots[0].ID != tt.firstSlot {
				t.Errorf("got %d slots starting %q, want %d starting %q", len(got.Slots), got.Slots[0].ID, tt.wantSlots, tt.firstSlot)
			}
		})
	}
}

func TestDefaultsPerHypervisor(t *testing.T) {
	f := newFiles(t)
	type summary struct {
		Hypervisor  string
		Backend     string
		Provider    string
		Zones       []string
		Timeouts    Timeouts
		Types       []string
		Offerings   []inventory.Offering
		BareMetal   bool
		FirstPrice  float64
		SlotsByZone map[string]int
	}
	res := inventory.DefaultResources()
	lvT := Timeouts{Create: 5 * time.Minute, Configure: 8 * time.Minute, Drain: 15 * time.Minute, Delete: 5 * time.Minute}
	pxT := Timeouts{Create: 8 * time.Minute, Configure: 8 * time.Minute, Drain: 15 * time.Minute, Delete: 5 * time.Minute}
	tests := []struct {
		name string
		args []string
		want summary
	}{
		{
			name: "libvirt fake",
			args: []string{"--use-fake-backend", "--seed-count", "6"},
			want: summary{
				Hypervisor: "libvirt", Backend: "fake", Provider: "libvirt", Zones: []string{"local-a", "local-b"}, Timeouts: lvT,
				Types: []string{"kvm.large", "kvm.medium", "kvm.small", "kvm.xlarge"},
				Offerings: []inventory.Offering{
					{InstanceType: "kvm.small", Zone: "local-a", CapacityType: "on_demand", Count: 2, Resources: res},
					{InstanceType: "kvm.large", Zone: "local-a", CapacityType: "on_demand", Count: 2, Resources: res},
					{InstanceType: "kvm.small", Zone: "local-b", CapacityType: "on_demand", Count: 1, Resources: res},
					{InstanceType: "kvm.large", Zone: "local-b", CapacityType: "on_demand", Count: 1, Resources: res},
				},
				FirstPrice: 0.0368, SlotsByZone: map[string]int{"local-a": 4, "local-b": 2},
			},
		},
		{
			name: "proxmox fake with a custom catalog, zone seed and timeouts",
			args: []string{"--use-fake-backend", "--hypervisor", "proxmox", "--default-zone", "lab", "--instance-types", f.catalog, "--seed-count", "3", "--create-timeout", "1m"},
			want: summary{
				Hypervisor: "proxmox", Backend: "fake", Provider: "proxmox", Zones: []string{"lab-a", "lab-b"},
				Timeouts: Timeouts{Create: time.Minute, Configure: 8 * time.Minute, Drain: 15 * time.Minute, Delete: 5 * time.Minute},
				Types:    []string{"pve.small"},
				Offerings: []inventory.Offering{
					{InstanceType: "pve.small", Zone: "lab-a", CapacityType: "on_demand", Count: 2, Resources: res},
					{InstanceType: "pve.small", Zone: "lab-b", CapacityType: "on_demand", Count: 1, Resources: res},
				},
				FirstPrice: 0.0092, SlotsByZone: map[string]int{"lab-a": 2, "lab-b": 1},
			},
		},
		{
			name: "libvirt single bare host merges default buckets and is bare metal",
			args: []string{"--connect", "qemu:///system", "--image", "base.qcow2", "--capacity-type", "metal", "--seed-count", "32", "--prices", "kvm.small=1"},
			want: summary{
				Hypervisor: "libvirt", Backend: "libvirt", Provider: "libvirt", Zones: []string{"local"}, Timeouts: lvT,
				Types: []string{"kvm.large", "kvm.medium", "kvm.small", "kvm.xlarge"},
				Offerings: []inventory.Offering{
					{InstanceType: "kvm.small", Zone: "local", CapacityType: "bare_metal", Count: 16, Resources: res},
					{InstanceType: "kvm.large", Zone: "local", CapacityType: "bare_metal", Count: 16, Resources: res},
				},
				BareMetal: true, FirstPrice: 0, SlotsByZone: map[string]int{"local": 32},
			},
		},
		{
			name: "proxmox real default mix uses the first two nodes",
			args: f.expand([]string{"--proxmox-api-url", "https://pve:8006/api2/json", "--proxmox-token-id", "a@pve!b", "--proxmox-token-secret", "x", "--proxmox-tls-fingerprint", "AB:" + repeat("cd", 31), "--nodes", "n1, n2,,n3", "--seed-count", "4"}, ""),
			want: summary{
				Hypervisor: "proxmox", Backend: "proxmox", Provider: "proxmox", Zones: []string{"n1", "n2", "n3"}, Timeouts: pxT,
				Types: []string{"pve.large", "pve.medium", "pve.small", "pve.xlarge"},
				Offerings: []inventory.Offering{
					{InstanceType: "pve.small", Zone: "n1", CapacityType: "on_demand", Count: 1, Resources: res},
					{InstanceType: "pve.large", Zone: "n1", CapacityType: "on_demand", Count: 1, Resources: res},
					{InstanceType: "pve.small", Zone: "n2", CapacityType: "on_demand", Count: 1, Resources: res},
					{InstanceType: "pve.large", Zone: "n2", CapacityType: "on_demand", Count: 1, Resources: res},
				},
				FirstPrice: 0.0368, SlotsByZone: map[string]int{"n1": 2, "n2": 2},
			},
		},
		{
			name: "fake zones include offering zones",
			args: []string{"--use-fake-backend", "--offerings", f.lvOfferings},
			want: summary{
				Hypervisor: "libvirt", Backend: "fake", Provider: "libvirt", Zones: []string{"local-a", "local-b", "rack1", "rack2"}, Timeouts: lvT,
				Types: []string{"kvm.large", "kvm.medium", "kvm.small", "kvm.xlarge"},
				Offerings: []inventory.Offering{
					{InstanceType: "kvm.small", Zone: "rack1", CapacityType: "on_demand", Count: 8, Resources: map[string]string{"cpu": "1", "memory": "2Gi"}},
					{InstanceType: "kvm.large", Zone: "rack2", CapacityType: "on_demand", Count: 4, Resources: map[string]string{"cpu": "2", "memory": "4Gi"}, Labels: map[string]string{"team": "batch"}},
				},
				FirstPrice: 0.0092, SlotsByZone: map[string]int{"rack1": 8, "rack2": 4},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parse(tt.args, io.Discard)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := summary{
				Hypervisor: c.Hypervisor, Backend: c.Backend, Provider: c.Provider, Zones: c.Zones, Timeouts: c.Timeouts,
				Types: c.Catalog.Names(), Offerings: c.Offerings, BareMetal: c.BareMetal, FirstPrice: c.Slots[0].PricePerHour,
				SlotsByZone: map[string]int{},
			}
			for _, s := range c.Slots {
				got.SlotsByZone[s.Zone]++
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}

func TestInference(t *testing.T) {
	f := newFiles(t)
	tests := []struct {
		args           []string
		wantHypervisor string
		wantBackend    string
	}{
		{[]string{"--use-fake-backend"}, "libvirt", "fake"},
		{[]string{"--libvirt-backend", "fake"}, "libvirt", "fake"},
		{[]string{"--proxmox-backend", "FAKE"}, "proxmox", "fake"},
		{[]string{"--nodes", "pve1", "--use-fake-backend"}, "proxmox", "fake"},
		{[]string{"--template-vmid", "9001", "--use-fake-backend"}, "proxmox", "fake"},
		{[]string{"--bootstrap-exec", "/usr/bin/python3", "--use-fake-backend"}, "proxmox", "fake"},
		{[]string{"--bootstrap-path", "/run/x", "--use-fake-backend"}, "proxmox", "fake"},
		{[]string{"--proxmox-pool", "bf", "--use-fake-backend"}, "proxmox", "fake"},
		{[]string{"--domain-type", "qemu", "--use-fake-backend"}, "libvirt", "fake"},
		{[]string{"--capacity-type", "bare_metal", "--use-fake-backend"}, "libvirt", "fake"},
		{[]string{"--storage-pool", "images", "--use-fake-backend"}, "libvirt", "fake"},
		{[]string{"--kernel", "/boot/vmlinuz", "--use-fake-backend"}, "libvirt", "fake"},
		{[]string{"--connect", "test:///default", "--image", "base"}, "libvirt", "libvirt"},
		{[]string{"--connect", "test:///default", "--use-fake-backend"}, "libvirt", "fake"},
		{[]string{"--hypervisor", "Proxmox", "--use-fake-backend"}, "proxmox", "fake"},
		{[]string{"--proxmox-api-url", "https://pve:8006/api2/json", "--proxmox-token-id", "a@pve!b", "--proxmox-token-file", f.token, "--proxmox-ca-file", f.pveCA, "--nodes", "pve1"}, "proxmox", "proxmox"},
		{[]string{"--proxmox-backend", "proxmox", "--proxmox-api-url", "https://pve/api2/json", "--proxmox-token-id", "a@pve!b", "--proxmox-token-file", f.token, "--proxmox-ca-file", f.pveCA, "--nodes", "pve1"}, "proxmox", "proxmox"},
	}
	for _, tt := range tests {
		c, err := parse(tt.args, io.Discard)
		if err != nil {
			t.Errorf("parse(%q): %v", tt.args, err)
			continue
		}
		if c.Hypervisor != tt.wantHypervisor || c.Backend != tt.wantBackend {
			t.Errorf("parse(%q) = %s/%s, want %s/%s", tt.args, c.Hypervisor, c.Backend, tt.wantHypervisor, tt.wantBackend)
		}
	}
}
