package pvemarker

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/observed"
)

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
