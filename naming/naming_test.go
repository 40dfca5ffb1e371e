package naming

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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

func TestSlug(t *testing.T) {
	tests := []struct{ in, want string }{
		{"libvirt-dc1", "libvirt-dc1"},
		{"Rack1/KVM.small/007", "rack1-kvm-small-007"},
		{"--a__b--", "a-b"},
		{"ünï", "n"},
		{"", ""},
		{"///", ""},
	}
	got := map[string]string{}
	want := map[string]string{}
	for _, tc := range tests {
		got[tc.in], want[tc.in] = Slug(tc.in), tc.want
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Slug (-want +got):\n%s", d)
	}
}
