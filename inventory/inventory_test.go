package inventory

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/go-multierror"
)

// problems splits an error into its one-line problems.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	var me *multierror.Error
	if errors.As(err, &me) {
		var out []string
		for _, e := range me.Errors {
			out = append(out, problems(e)...)
		}
		return out
	}
	return strings.Split(err.Error(), "\n")
}

func TestBuiltin(t *testing.T) {
	want := Catalog{
		"pve.small":  {Name: "pve.small", VCPU: 2, MemoryMiB: 4096, Source: 9001},
		"pve.medium": {Name: "pve.medium", VCPU: 4, MemoryMiB: 8192, Source: 9001},
		"pve.large":  {Name: "pve.large", VCPU: 8, MemoryMiB: 16384, Source: 9001},
		"pve.xlarge": {Name: "pve.xlarge", VCPU: 16, MemoryMiB: 32768, Source: 9001},
	}
	if diff := cmp.Diff(want, Builtin(px.catalog(9001))); diff != "" {
		t.Errorf("Builtin(proxmox) (-want +got):\n%s", diff)
	}
	lvWant := Catalog{
		"kvm.small":  {Name: "kvm.small", VCPU: 2, MemoryMiB: 4096},
		"kvm.medium": {Name: "kvm.medium", VCPU: 4, MemoryMiB: 8192},
		"kvm.large":  {Name: "kvm.large", VCPU: 8, MemoryMiB: 16384},
		"kvm.xlarge": {Name: "kvm.xlarge", VCPU: 16, MemoryMiB: 32768},
	}
	if diff := cmp.Diff(lvWant, Builtin(lv.catalog(9000))); diff != "" {
		t.Errorf("Builtin(libvirt) (-want +got):\n%s", diff)
	}
}

func TestParseCatalog(t *testing.T) {
	tests := []struct {
		name    string
		shape   testShape
		in      string
		want    Catalog
		wantErr []string
	}{
		{
			name:  "libvirt doc example",
			shape: lv,
			in:    `{"kvm.small": {"vcpu": 2, "memory_mib": 4096}, "build.2x": {"vcpu": 8, "memory_mib": 32768}}`,
			want: Catalog{
				"kvm.small": {Name: "kvm.small", VCPU: 2, MemoryMiB: 4096},
				"build.2x":  {Name: "build.2x", VCPU: 8, MemoryMiB: 32768},
			},
		},
		{
			name:  "proxmox zero and omitted template fall back",
			shape: px,
			in:    `{"a": {"vcpu": 1, "memory_mib": 512, "template_vmid": 0}, "b": {"vcpu": 1, "memory_mib": 512}, "c": {"vcpu": 1, "memory_mib": 512, "template_vmid": 9100}}`,
			want: Catalog{
				"a": {Name: "a", VCPU: 1, MemoryMiB: 512, Source: 9000},
				"b": {Name: "b", VCPU: 1, MemoryMiB: 512, Source: 9000},
				"c": {Name: "c", VCPU: 1, MemoryMiB: 512, Source: 9100},
			},
		},
		{name: "not json", shape: lv, in: `{`, wantErr: []string{"not valid JSON: unexpected end of input"}},
		{name: "array", shape: lv, in: `[]`, wantErr: []string{`must be a JSON object of name -> {"vcpu": N, "memory_mib": N}`}},
		{name: "empty", shape: lv, in: `{}`, wantErr: []string{"defines no instance types; add at least one or omit --instance-types to use the built-in catalog"}},
		{name: "trailing", shape: lv, in: `{"a": {"vcpu": 1, "memory_mib": 1}} {}`, wantErr: []string{"trailing data after the catalog object; the file must hold exactly one JSON object"}},
		{
			name: "misspelled key", shape: lv, in: `{"a": {"vcpus": 1, "memory_mib": 1}}`,
			wantErr: []string{`instance type "a": unknown key "vcpus" (allowed keys: vcpu, memory_mib)`},
		},
		{
			name: "wrong type", shape: px, in: `{"a": {"vcpu": "2", "memory_mib": 1}}`,
			wantErr: []string{`instance type "a": key "vcpu" must be a JSON integer, got string (allowed keys: vcpu, memory_mib, template_vmid)`},
		},
		{
			name: "every entry problem", shape: lv,
			in: `{"a": {"vcpu": 0, "memory_mib": -1, "template_vmid": 9000}, "b": {}, "x y": {"vcpu": 1, "memory_mib": 1}, "a": {"vcpu": 1, "memory_mib": 1}}`,
			wantErr: []string{
				`line 1: key "a" is given twice in one object (first on line 1); keep one`,
				`instance type "a": vcpu must be positive, got 0`,
				`instance type "a": memory_mib must be positive, got -1`,
				`instance type "a": template_vmid is a Proxmox setting; libvirt types boot from --image, remove the key`,
				`instance type "b": vcpu is required`,
				`instance type "b": memory_mib is required`,
				`instance type name "x y" contains whitespace; rename it`,
			},
		},
		{
			name: "a key given twice inside an entry, with its lines", shape: lv,
			in: "{\n  \"a\": {\n    \"vcpu\": 1,\n    \"memory_mib\": 512,\n    \"vcpu\": 64\n  },\n  \"b\": {\"vcpu\": 1, \"memory_mib\": 1},\n  \"b\": {\"vcpu\": 2, \"memory_mib\": 2}\n}",
			wantErr: []string{
				`line 5: key "vcpu" is given twice in one object (first on line 3); keep one`,
				`line 8: key "b" is given twice in one object (first on line 7); keep one`,
			},
		},
		{
			name: "sizes above their caps", shape: lv,
			in: `{"huge": {"vcpu": 1025, "memory_mib": 16777217}, "max": {"vcpu": 1024, "memory_mib": 16777216}}`,
			wantErr: []string{
				`instance type "huge": vcpu 1025 is above the cap of 1024`,
				`instance type "huge": memory_mib 16777217 is above the cap of 16777216 (16 TiB)`,
			},
		},
		{
			name: "slash in name", shape: lv, in: `{"a/b": {"vcpu": 1, "memory_mib": 1}}`,
			wantErr: []string{`instance type name "a/b" contains '/' or ':', which machine ids and host refs use as separators; rename it`},
		},
		{
			name: "template out of range", shape: px, in: `{"a": {"vcpu": 1, "memory_mib": 1, "template_vmid": 5}}`,
			wantErr: []string{`instance type "a": template_vmid: template VMID 5 is outside the Proxmox VMID range 100..999999999`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCatalog([]byte(tt.in), tt.shape.catalog(9000))
			if diff := cmp.Diff(tt.wantErr, problems(err)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("catalog (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAllocatable(t *testing.T) {
	tests := []struct {
		it   InstanceType
		want map[string]string
	}{
		{InstanceType{VCPU: 2, MemoryMiB: 4096}, map[string]string{"cpu": "2", "memory": "4Gi"}},
		{InstanceType{VCPU: 1, MemoryMiB: 1536}, map[string]string{"cpu": "1", "memory": "1536Mi"}},
		{InstanceType{VCPU: 16, MemoryMiB: 1024}, map[string]string{"cpu": "16", "memory": "1Gi"}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, Allocatable(tt.it)); diff != "" {
			t.Errorf("Allocatable(%+v) (-want +got):\n%s", tt.it, diff)
		}
	}
}

func TestParseCapacityType(t *testing.T) {
	tests := []struct {
		in      string
		shape   testShape
		want    CapacityType
		wantErr string
	}{
		{"", lv, OnDemand, ""},
		{"on_demand", lv, OnDemand, ""},
		{"On-Demand", px, OnDemand, ""},
		{" ondemand ", px, OnDemand, ""},
		{"bare_metal", lv, BareMetal, ""},
		{"bare-metal", lv, BareMetal, ""},
		{"METAL", lv, BareMetal, ""},
		{"spot", lv, "", `capacity_type "spot" is not supported: a libvirt host has no preemption market; use on_demand`},
		{"spot", px, "", `capacity_type "spot" is not supported: a self-hosted Proxmox cluster has no preemption market; use on_demand`},
		{"reserved", lv, "", `capacity_type "reserved" is not supported: a libvirt host has no reservation or commitment billing; use on_demand`},
		{"reserved", px, "", `capacity_type "reserved" is not supported: a self-hosted Proxmox cluster has no reservation or commitment billing; use on_demand`},
		{"bare_metal", px, "", `capacity_type "bare_metal" is not supported on Proxmox: its VMs are deletable clones, not a fixed free pool; use on_demand`},
		{"gpu", lv, "", `unknown capacity_type "gpu"; use on_demand or bare_metal`},
		{"gpu", px, "", `unknown capacity_type "gpu"; use on_demand`},
	}
	for _, tt := range tests {
		got, err := ParseCapacityType(tt.in, tt.shape.capacity())
		gotErr := ""
		if err != nil {
			gotErr = err.Error()
		}
		if got != tt.want || gotErr != tt.wantErr {
			t.Errorf("ParseCapacityType(%q, %s) = %q, %q; want %q, %q", tt.in, tt.shape, got, gotErr, tt.want, tt.wantErr)
		}
	}
}

// manyEntries is the body of a JSON object with n distinct string keys.
func manyEntries(n int) string {
	entries := make([]string, n)
	for i := range entries {
		entries[i] = fmt.Sprintf(`"k%d": "v"`, i)
	}
	return strings.Join(entries, ", ")
}

func TestParseOfferings(t *testing.T) {
	rules := Rules{Capacity: lv.capacity(), Catalog: Builtin(lv.catalog(0)), Zones: []string{"rack1", "rack2"}, ZoneFlag: "--connect"}
	tests := []struct {
		name    string
		rules   Rules
		in      string
		want    []Offering
		wantErr []string
	}{
		{
			name:  "libvirt doc example",
			rules: rules,
			in: `[
  {"instance_type": "kvm.small", "zone": "rack1", "capacity_type": "on_demand", "count": 8, "resources": {"cpu": "1", "memory": "2Gi"}},
  {"instance_type": "kvm.large", "zone": "rack2", "capacity_type": "on_demand", "count": 4, "resources": {"cpu": "2", "memory": "4Gi"}, "labels": {"team": "batch"}}
]`,
			want: []Offering{
				{InstanceType: "kvm.small", Zone: "rack1", CapacityType: OnDemand, Count: 8, Resources: map[string]string{"cpu": "1", "memory": "2Gi"}},
				{InstanceType: "kvm.large", Zone: "rack2", CapacityType: OnDemand, Count: 4, Resources: map[string]string{"cpu": "2", "memory": "4Gi"}, Labels: map[string]string{"team": "batch"}},
			},
		},
		{
			name:  "capacity spellings canonicalised; any zone without a zone set",
			rules: Rules{Capacity: lv.capacity(), Catalog: Builtin(lv.catalog(0))},
			in:    `[{"instance_type": "kvm.small", "zone": "anywhere", "count": 1}, {"instance_type": "kvm.large", "zone": "anywhere", "capacity_type": "On-Demand", "count": 2}]`,
			want: []Offering{
				{InstanceType: "kvm.small", Zone: "anywhere", CapacityType: OnDemand, Count: 1},
				{InstanceType: "kvm.large", Zone: "anywhere", CapacityType: OnDemand, Count: 2},
			},
		},
		{
			name:  "same type in two zones is fine",
			rules: rules,
			in:    `[{"instance_type": "kvm.small", "zone": "rack1", "capacity_type": "metal", "count": 1}, {"instance_type": "kvm.small", "zone": "rack2", "capacity_type": "bare_metal", "count": 1}]`,
			want: []Offering{
				{InstanceType: "kvm.small", Zone: "rack1", CapacityType: BareMetal, Count: 1},
				{InstanceType: "kvm.small", Zone: "rack2", CapacityType: BareMetal, Count: 1},
			},
		},
		{name: "not json", rules: rules, in: `[`, wantErr: []string{"not valid JSON: unexpected end of input"}},
		{name: "object", rules: rules, in: `{}`, wantErr: []string{"must be a JSON array of offering objects"}},
		{name: "empty", rules: rules, in: `[]`, wantErr: []string{"holds no offerings; add at least one or omit --offerings to use the default mix"}},
		{name: "trailing", rules: rules, in: `[] []`, wantErr: []string{"trailing data after the offerings array; the file must hold exactly one JSON array"}},
		{
			name: "unknown key", rules: rules, in: `[{"instance_type": "kvm.small", "zone": "rack1", "cout": 1}]`,
			wantErr: []string{`offerings[0]: unknown key "cout" (allowed keys: instance_type, zone, capacity_type, count, resources, labels)`},
		},
		{
			name: "wrong value type", rules: rules, in: `[{"instance_type": "kvm.small", "zone": "rack1", "count": "3"}]`,
			wantErr: []string{`offerings[0]: key "count" must be a JSON integer, got string (allowed keys: instance_type, zone, capacity_type, count, resources, labels)`},
		},
		{
			name: "missing required keys", rules: rules, in: `[{"capacity_type": "on_demand"}]`,
			wantErr: []string{"offerings[0]: missing required key(s) instance_type, zone, count"},
		},
		{
			name: "decode and validation problems reported together", rules: rules,
			in: `[{"instance_type": "kvm.small", "zone": "rack1", "count": 1, "labels": {"a": 1}}, {"instance_type": "kvm.tiny", "zone": "rack1", "count": 1}]`,
			wantErr: []string{
				`offerings[0]: key "labels" must map names to JSON strings, got a number value (allowed keys: instance_type, zone, capacity_type, count, resources, labels)`,
				`offerings[1]: instance_type "kvm.tiny" is not in the instance-type catalog (known: kvm.large, kvm.medium, kvm.small, kvm.xlarge)`,
			},
		},
		{
			name:  "every validation problem",
			rules: rules,
			in: `[
  {"instance_type": "kvm.tiny", "zone": "rack9", "capacity_type": "spot", "count": 0, "resources": {"": "1"}, "labels": {"": "x"}},
  {"instance_type": "", "zone": "", "count": 1},
  {"instance_type": "kvm.small", "zone": "rack 1", "count": 1},
  {"instance_type": "kvm.small", "zone": "rack1", "capacity_type": "reserved", "count": 1},
  {"instance_type": "kvm.small", "zone": "rack1", "count": 2}
]`,
			wantErr: []string{
				`offerings[0]: zone "rack9" is not one of the configured zones (--connect: rack1, rack2); add it there or place the offering on a configured zone`,
				`offerings[0]: instance_type "kvm.tiny" is not in the instance-type catalog (known: kvm.large, kvm.medium, kvm.small, kvm.xlarge)`,
				`offerings[0]: capacity_type "spot" is not supported: a libvirt host has no preemption market; use on_demand`,
				`offerings[0]: count must be positive, got 0`,
				`offerings[0]: resources has an empty key`,
				`offerings[0]: labels has an empty key`,
				`offerings[1]: zone is empty`,
				`offerings[1]: instance_type is empty; name a catalog type`,
				`offerings[2]: zone "rack 1" contains whitespace; rename it`,
				`offerings[3]: capacity_type "reserved" is not supported: a libvirt host has no reservation or commitment billing; use on_demand`,
				`offerings[4]: duplicates offerings[3] (zone "rack1", instance_type "kvm.small"): both would mint the same machine ids; merge them into one offering with the summed count`,
			},
		},
		{
			name: "a key given twice, at any depth, with its lines", rules: rules,
			in: "[\n  {\"instance_type\": \"kvm.small\", \"zone\": \"rack1\",\n   \"count\": 1,\n   \"labels\": {\"team\": \"a\", \"team\": \"b\"},\n   \"count\": 500}\n]",
			wantErr: []string{
				`line 4: key "team" is given twice in one object (first on line 4); keep one`,
				`line 5: key "count" is given twice in one object (first on line 3); keep one`,
			},
		},
		{
			name: "labels and resources above their caps", rules: rules,
			in: `[{"instance_type": "kvm.small", "zone": "rack1", "count": 1, "labels": {` + manyEntries(65) + `},
			      "resources": {"cpu": "` + strings.Repeat("1", 1025) + `", "` + strings.Repeat("k", 257) + `": "1"}}]`,
			wantErr: []string{
				`offerings[0]: resources["cpu"] is 1025 bytes; the cap is 1024`,
				`offerings[0]: resources key "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"... is 257 bytes; the cap is 256`,
				`offerings[0]: labels has 65 entries; the cap is 64`,
			},
		},
		{
			name: "zone with colon", rules: Rules{Capacity: lv.capacity(), Catalog: Builtin(lv.catalog(0))},
			in:      `[{"instance_type": "kvm.small", "zone": "a:b", "count": 1}]`,
			wantErr: []string{`offerings[0]: zone "a:b" contains '/' or ':', which machine ids and host refs use as separators; rename it`},
		},
		{
			name: "libvirt capacity mix", rules: rules,
			in:      `[{"instance_type": "kvm.small", "zone": "rack1", "count": 1}, {"instance_type": "kvm.large", "zone": "rack1", "capacity_type": "bare_metal", "count": 1}]`,
			wantErr: []string{"offerings mix on_demand (1) and bare_metal (1) capacity: a bare-metal pool is never deleted while an on-demand one is, so run one instance per capacity class"},
		},
		{
			name: "proxmox rejects bare metal", rules: Rules{Capacity: px.capacity(), Catalog: Builtin(px.catalog(9000)), Zones: []string{"pve1"}, ZoneFlag: "--nodes"},
			in: `[{"instance_type": "pve.small", "zone": "pve1", "capacity_type": "bare-metal", "count": 1}, {"instance_type": "pve.small", "zone": "pve2", "count": 1}]`,
			wantErr: []string{
				`offerings[0]: capacity_type "bare-metal" is not supported on Proxmox: its VMs are deletable clones, not a fixed free pool; use on_demand`,
				`offerings[1]: zone "pve2" is not one of the configured zones (--nodes: pve1); add it there or place the offering on a configured zone`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseOfferings([]byte(tt.in), tt.rules)
			if diff := cmp.Diff(tt.wantErr, problems(err)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("offerings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDefaultOfferings(t *testing.T) {
	res := DefaultResources()
	tests := []struct {
		name    string
		shape   testShape
		catalog Catalog
		zones   []string
		seed    int
		ct      CapacityType
		want    []Offering
		wantErr string
	}{
		{
			name: "32 over two zones", shape: lv, catalog: Builtin(lv.catalog(0)), zones: []string{"local-a", "local-b"}, seed: 32, ct: OnDemand,
			want: []Offering{
				{InstanceType: "kvm.small", Zone: "local-a", CapacityType: OnDemand, Count: 8, Resources: res},
				{InstanceType: "kvm.large", Zone: "local-a", CapacityType: OnDemand, Count: 8, Resources: res},
				{InstanceType: "kvm.small", Zone: "local-b", CapacityType: OnDemand, Count: 8, Resources: res},
				{InstanceType: "kvm.large", Zone: "local-b", CapacityType: OnDemand, Count: 8, Resources: res},
			},
		},
		{
			name: "remainder to the earliest, only first two zones", shape: px, catalog: Builtin(px.catalog(9000)), zones: []string{"pve1", "pve2", "pve3"}, seed: 6, ct: OnDemand,
			want: []Offering{
				{InstanceType: "pve.small", Zone: "pve1", CapacityType: OnDemand, Count: 2, Resources: res},
				{InstanceType: "pve.large", Zone: "pve1", CapacityType: OnDemand, Count: 2, Resources: res},
				{InstanceType: "pve.small", Zone: "pve2", CapacityType: OnDemand, Count: 1, Resources: res},
				{InstanceType: "pve.large", Zone: "pve2", CapacityType: OnDemand, Count: 1, Resources: res},
			},
		},
		{
			name: "one zone merges buckets", shape: lv, catalog: Builtin(lv.catalog(0)), zones: []string{"local"}, seed: 32, ct: BareMetal,
			want: []Offering{
				{InstanceType: "kvm.small", Zone: "local", CapacityType: BareMetal, Count: 16, Resources: res},
				{InstanceType: "kvm.large", Zone: "local", CapacityType: BareMetal, Count: 16, Resources: res},
			},
		},
		{
			name: "small seed drops empty buckets", shape: lv, catalog: Builtin(lv.catalog(0)), zones: []string{"a", "b"}, seed: 1, ct: OnDemand,
			want: []Offering{{InstanceType: "kvm.small", Zone: "a", CapacityType: OnDemand, Count: 1, Resources: res}},
		},
		{
			name: "custom catalog uses smallest and largest by vCPU then name", shape: lv,
			catalog: Catalog{
				"z.tiny": {Name: "z.tiny", VCPU: 1, MemoryMiB: 1024},
				"a.mid":  {Name: "a.mid", VCPU: 4, MemoryMiB: 1024},
				"b.big":  {Name: "b.big", VCPU: 8, MemoryMiB: 1024},
				"a.big":  {Name: "a.big", VCPU: 8, MemoryMiB: 1024},
			},
			zones: []string{"a", "b"}, seed: 4, ct: OnDemand,
			want: []Offering{
				{InstanceType: "z.tiny", Zone: "a", CapacityType: OnDemand, Count: 1, Resources: res},
				{InstanceType: "b.big", Zone: "a", CapacityType: OnDemand, Count: 1, Resources: res},
				{InstanceType: "z.tiny", Zone: "b", CapacityType: OnDemand, Count: 1, Resources: res},
				{InstanceType: "b.big", Zone: "b", CapacityType: OnDemand, Count: 1, Resources: res},
			},
		},
		{
			name: "one-type catalog and one zone merge everything", shape: px,
			catalog: Catalog{"only": {Name: "only", VCPU: 1, MemoryMiB: 1024, Source: 9000}},
			zones:   []string{"pve1"}, seed: 5, ct: OnDemand,
			want: []Offering{{InstanceType: "only", Zone: "pve1", CapacityType: OnDemand, Count: 5, Resources: res}},
		},
		{name: "zero seed", shape: lv, catalog: Builtin(lv.catalog(0)), zones: []string{"a"}, seed: 0, wantErr: "seed count must be positive, got 0"},
		{name: "negative seed", shape: lv, catalog: Builtin(lv.catalog(0)), zones: []string{"a"}, seed: -3, wantErr: "seed count must be positive, got -3"},
		{name: "no zones", shape: lv, catalog: Builtin(lv.catalog(0)), seed: 3, wantErr: "no zones to place the default offerings on"},
		{name: "empty catalog", shape: lv, catalog: Catalog{}, zones: []string{"a"}, seed: 3, wantErr: "the instance-type catalog is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DefaultOfferings(tt.shape.prefix(), tt.shape.capacity(), tt.catalog, tt.zones, tt.seed, tt.ct)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tt.wantErr {
				t.Errorf("error = %q, want %q", gotErr, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("offerings (-want +got):\n%s", diff)
			}
			if err != nil {
				return
			}
			slots, err := Slots(got, tt.catalog, Pricing{})
			if err != nil {
				t.Fatalf("Slots: %v", err)
			}
			if len(slots) != tt.seed {
				t.Errorf("got %d slots, want seed count %d", len(slots), tt.seed)
			}
		})
	}
}

func TestMachineID(t *testing.T) {
	tests := []struct {
		zone, typ string
		index     int
		want      string
	}{
		{"rack1", "kvm.small", 0, "rack1/kvm.small/000"},
		{"rack1", "kvm.small", 7, "rack1/kvm.small/007"},
		{"pve1", "pve.large", 999, "pve1/pve.large/999"},
		{"pve1", "pve.large", 1000, "pve1/pve.large/1000"},
		{"pve1", "pve.large", 12345, "pve1/pve.large/12345"},
	}
	for _, tt := range tests {
		got := MachineID(tt.zone, tt.typ, tt.index)
		if got != tt.want {
			t.Errorf("MachineID(%q, %q, %d) = %q, want %q", tt.zone, tt.typ, tt.index, got, tt.want)
		}
		z, ty, i, ok := ParseMachineID(got)
		if !ok || z != tt.zone || ty != tt.typ || i != tt.index {
			t.Errorf("ParseMachineID(%q) = %q, %q, %d, %v; want the inputs back", got, z, ty, i, ok)
		}
	}
}

func TestParseMachineIDRejects(t *testing.T) {
	for _, id := range []string{
		"", "rack1", "rack1/kvm.small", "rack1/kvm.small/7", "rack1/kvm.small/0007", "rack1/kvm.small/01000",
		"rack1/kvm.small/-01", "rack1/kvm.small/+001", "rack1/kvm.small/00a", "/kvm.small/000", "rack1//000",
		"libvirt-dc1/OnDemand/kvm.small/rack1/007", "rack 1/kvm.small/000", "rack1/kvm.small/000/",
		"rack1/kvm.small/99999999999999999999999",
	} {
		if z, ty, i, ok := ParseMachineID(id); ok {
			t.Errorf("ParseMachineID(%q) = %q, %q, %d, true; want not ok", id, z, ty, i)
		}
	}
}

func TestPricing(t *testing.T) {
	p, err := NewPricing(DefaultPricePerVCPUHour, DefaultPricePerGiBHour, map[string]float64{"kvm.large": 0.5})
	if err != nil {
		t.Fatal(err)
	}
	c := Builtin(lv.catalog(0))
	got := map[string]float64{}
	for _, n := range c.Names() {
		got[n] = p.Price(c[n], OnDemand)
	}
	got["bare kvm.xlarge"] = p.Price(c["kvm.xlarge"], BareMetal)
	got["bare kvm.large"] = p.Price(c["kvm.large"], BareMetal)
	want := map[string]float64{
		"kvm.small": 0.0092, "kvm.medium": 0.0184, "kvm.large": 0.5, "kvm.xlarge": 0.0736,
		"bare kvm.xlarge": 0, "bare kvm.large": 0,
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("prices (-want +got):\n%s", diff)
	}

	zero, err := NewPricing(0, 0, nil)
	if err != nil {
		t.Fatalf("zero rates must be allowed: %v", err)
	}
	if got := zero.Price(c["kvm.small"], OnDemand); got != 0 {
		t.Errorf("zero-rate price = %v, want 0", got)
	}
}

func TestNewPricingErrors(t *testing.T) {
	tests := []struct {
		vcpu, gib float64
		want      []string
	}{
		{-1, 0, []string{"per-vCPU rate: -1 is negative; prices must be >= 0"}},
		{math.NaN(), math.Inf(1), []string{"per-vCPU rate: NaN is not a finite number", "per-GiB rate: +Inf is not a finite number"}},
		{1e300, MaxPricePerHour, []string{"per-vCPU rate: 1e+300 is above the cap of 1000000 USD/hour"}},
	}
	for _, tt := range tests {
		_, err := NewPricing(tt.vcpu, tt.gib, nil)
		if diff := cmp.Diff(tt.want, problems(err)); diff != "" {
			t.Errorf("NewPricing(%v, %v) errors (-want +got):\n%s", tt.vcpu, tt.gib, diff)
		}
	}
}

func TestParsePrices(t *testing.T) {
	c := Builtin(lv.catalog(0))
	tests := []struct {
		in      string
		want    map[string]float64
		wantErr []string
	}{
		{in: "", want: nil},
		{in: "kvm.small=0.05, kvm.large=0,", want: map[string]float64{"kvm.small": 0.05, "kvm.large": 0}},
		{
			in: "kvm.small,=1,kvm.large=abc,kvm.medium=-1,kvm.xlarge=NaN,kvm.tiny=1,kvm.small=1,kvm.small=2,kvm.large=Inf",
			wantErr: []string{
				`entry "kvm.small" must be type=usd, e.g. kvm.small=0.05`,
				`entry "=1" must be type=usd, e.g. kvm.small=0.05`,
				`price "abc" for kvm.large is not a number`,
				"price for kvm.medium: -1 is negative; prices must be >= 0",
				"price for kvm.xlarge: NaN is not a finite number",
				`"kvm.tiny" is not in the instance-type catalog (known: kvm.large, kvm.medium, kvm.small, kvm.xlarge)`,
				"kvm.small is priced twice; keep one entry",
				"price for kvm.large: +Inf is not a finite number",
			},
		},
		{
			in:      "kvm.small=1000000,kvm.large=1000000.5",
			wantErr: []string{"price for kvm.large: 1.0000005e+06 is above the cap of 1000000 USD/hour"},
		},
	}
	for _, tt := range tests {
		got, err := ParsePrices(tt.in, c)
		if diff := cmp.Diff(tt.wantErr, problems(err)); diff != "" {
			t.Errorf("ParsePrices(%q) errors (-want +got):\n%s", tt.in, diff)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParsePrices(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestSlots(t *testing.T) {
	c := Builtin(lv.catalog(0))
	p, _ := NewPricing(DefaultPricePerVCPUHour, DefaultPricePerGiBHour, nil)
	offs := []Offering{
		{InstanceType: "kvm.large", Zone: "rack2", CapacityType: OnDemand, Count: 2, Labels: map[string]string{"team": "batch"}},
		{InstanceType: "kvm.small", Zone: "rack1", CapacityType: OnDemand, Count: 1, Resources: map[string]string{"cpu": "1"}},
	}
	want := []Slot{
		{ID: "rack1/kvm.small/000", Zone: "rack1", Index: 0, Type: c["kvm.small"], Capacity: OnDemand, Resources: map[string]string{"cpu": "1"}, PricePerHour: 0.0092},
		{ID: "rack2/kvm.large/000", Zone: "rack2", Index: 0, Type: c["kvm.large"], Capacity: OnDemand, Labels: map[string]string{"team": "batch"}, PricePerHour: 0.0368},
		{ID: "rack2/kvm.large/001", Zone: "rack2", Index: 1, Type: c["kvm.large"], Capacity: OnDemand, Labels: map[string]string{"team": "batch"}, PricePerHour: 0.0368},
	}
	got, err := Slots(offs, c, p)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("Slots (-want +got):\n%s", diff)
	}
	// Reordering offerings changes nothing; the id never embeds a provider label.
	rev, _ := Slots([]Offering{offs[1], offs[0]}, c, p)
	if diff := cmp.Diff(got, rev); diff != "" {
		t.Errorf("Slots depends on offering order (-first +reordered):\n%s", diff)
	}
	// Slots own their maps.
	got[1].Labels["team"] = "changed"
	if got[2].Labels["team"] != "batch" || offs[0].Labels["team"] != "batch" {
		t.Error("slots share label maps with each other or with the offering")
	}
	// Shrinking drops the highest index.
	offs[0].Count = 1
	shrunk, _ := Slots(offs, c, p)
	if diff := cmp.Diff([]string{"rack1/kvm.small/000", "rack2/kvm.large/000"}, ids(shrunk)); diff != "" {
		t.Errorf("shrunk ids (-want +got):\n%s", diff)
	}

	if _, err := Slots([]Offering{{InstanceType: "nope", Zone: "a", Count: 1}}, c, p); err == nil || err.Error() != `offerings[0]: instance_type "nope" is not in the catalog` {
		t.Errorf("unknown type: err = %v", err)
	}
	dup := []Offering{{InstanceType: "kvm.small", Zone: "a", Count: 1}, {InstanceType: "kvm.small", Zone: "a", Count: 1}}
	if _, err := Slots(dup, c, p); err == nil || err.Error() != `two offerings mint machine id "a/kvm.small/000"; merge the offerings for zone "a" and type "kvm.small"` {
		t.Errorf("duplicate ids: err = %v", err)
	}
}

func ids(slots []Slot) []string {
	out := make([]string, len(slots))
	for i, s := range slots {
		out[i] = s.ID
	}
	return out
}

func TestValidateEmpty(t *testing.T) {
	if _, err := Validate(nil, Rules{Capacity: lv.capacity(), Catalog: Builtin(lv.catalog(0))}); err == nil || err.Error() != "no offerings: add at least one" {
		t.Errorf("err = %v", err)
	}
}

func TestValidateZone(t *testing.T) {
	long := strings.Repeat("z", 64)
	tests := []struct{ in, want string }{
		{"rack1", ""},
		{"", "zone is empty"},
		{"a/b", `zone "a/b" contains '/' or ':', which machine ids and host refs use as separators; rename it`},
		{"a\tb", `zone "a\tb" contains whitespace; rename it`},
		{"a\x00b", `zone "a\x00b" contains a non-printable character; rename it`},
		{long, `zone "` + long + `" is 64 bytes long; use at most 63`},
	}
	for _, tt := range tests {
		got := ""
		if err := ValidateZone(tt.in); err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("ValidateZone(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestLoadFiles(t *testing.T) {
	dir := t.TempDir()
	bad := dir + "/bad.json"
	if err := os.WriteFile(bad, []byte(`{"a": {"vcpu": 0, "memory_mib": 0}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadCatalog(bad, lv.catalog(0))
	want := []string{
		bad + `: instance type "a": vcpu must be positive, got 0`,
		bad + `: instance type "a": memory_mib must be positive, got 0`,
	}
	if diff := cmp.Diff(want, problems(err)); diff != "" {
		t.Errorf("LoadCatalog errors (-want +got):\n%s", diff)
	}
	if err := os.WriteFile(bad, []byte(`[{"instance_type": "kvm.small", "zone": "a", "count": 1}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	offs, err := LoadOfferings(bad, Rules{Capacity: lv.capacity(), Catalog: Builtin(lv.catalog(0))})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Offering{{InstanceType: "kvm.small", Zone: "a", CapacityType: OnDemand, Count: 1}}, offs); diff != "" {
		t.Errorf("LoadOfferings (-want +got):\n%s", diff)
	}
	_, err = LoadOfferings(dir+"/missing.json", Rules{})
	if diff := cmp.Diff([]string{"read offerings: open " + dir + "/missing.json: no such file or directory"}, problems(err)); diff != "" {
		t.Errorf("LoadOfferings missing (-want +got):\n%s", diff)
	}
}

// TestLoadFilesRefusesWhatIsNotARegularFile checks neither loader reads a
// device (which would never end) or waits on a FIFO (which would hang
// start-up), and that a file over the cap is refused before it is parsed.
func TestLoadFilesRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "offerings.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, bytes.Repeat([]byte(" "), conffile.MaxJSONBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{"/dev/zero", "read offerings: /dev/zero is a character device, not a regular file: name a regular file"},
		{fifo, "read offerings: " + fifo + " is a FIFO (named pipe), not a regular file: name a regular file"},
		{big, "read offerings: " + big + " is 16777217 bytes, more than 16 MiB, the cap for this file (file too large)"},
	} {
		done := make(chan error, 2)
		go func() {
			_, err := LoadOfferings(tc.path, Rules{Capacity: lv.capacity(), Catalog: Builtin(lv.catalog(0))})
			done <- err
			_, err = LoadCatalog(tc.path, lv.catalog(0))
			done <- err
		}()
		for _, what := range []string{"LoadOfferings", "LoadCatalog"} {
			select {
			case err := <-done:
				want := tc.want
				if what == "LoadCatalog" {
					want = strings.Replace(want, "read offerings", "read instance types", 1)
				}
				if diff := cmp.Diff([]string{want}, problems(err)); diff != "" {
					t.Errorf("%s(%s) (-want +got):\n%s", what, tc.path, diff)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s(%s) has not returned after 30s", what, tc.path)
			}
		}
	}
}

func TestZonesAndErrorText(t *testing.T) {
	offs := []Offering{{Zone: "b"}, {Zone: "a"}, {Zone: "b"}}
	if diff := cmp.Diff([]string{"a", "b"}, Zones(offs)); diff != "" {
		t.Errorf("Zones (-want +got):\n%s", diff)
	}
	_, err := ParsePrices("a,b", Builtin(lv.catalog(0)))
	want := "entry \"a\" must be type=usd, e.g. kvm.small=0.05\nentry \"b\" must be type=usd, e.g. kvm.small=0.05"
	if err == nil || err.Error() != want {
		t.Errorf("error text = %q, want one problem per line %q", err, want)
	}
}
