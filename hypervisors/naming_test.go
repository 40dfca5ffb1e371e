package hypervisors

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/observed"
)

func TestVMName(t *testing.T) {
	a := VMName("libvirt-dc1", "rack1/kvm.small/007", 1)
	if len(a) > maxNameLen || !strings.HasPrefix(a, "bf-libvirt-dc1-rack1-kvm-small-007-") || !strings.HasSuffix(a, "-c1") {
		t.Errorf("VMName = %q", a)
	}
	// Ids that sanitise alike still get different names; so do cycles.
	if b := VMName("libvirt-dc1", "rack1/kvm-small/007", 1); b == a {
		t.Errorf("collision: %q", b)
	}
	if c := VMName("libvirt-dc1", "rack1/kvm.small/007", 2); c == a {
		t.Errorf("cycle does not change the name: %q", c)
	}
	long := VMName(strings.Repeat("i", 80), strings.Repeat("zone/", 30), 12)
	if len(long) > maxNameLen {
		t.Errorf("%d-byte name %q", len(long), long)
	}
}

func TestDescriptionRoundTrip(t *testing.T) {
	m := observed.Marker{Installation: "inst", MachineID: "pve1/pve.small/000", OpID: "op-7", InstanceType: "pve.small", Cluster: "c&1 =x"}
	got := ParseDescription("operator notes\n" + Description(m))
	if diff := cmp.Diff(&m, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	if ParseDescription("bigfleet-marker: machine_id=x") != nil {
		t.Error("a marker without installation was accepted")
	}
	if !HasOwnershipTags(Tags(m), "inst") || HasOwnershipTags(Tags(m), "other") || HasOwnershipTags([]string{TagOwned}, "inst") {
		t.Error("ownership tags")
	}
}
