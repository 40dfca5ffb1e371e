package mem

import (
	"os/exec"
	"strings"
	"testing"
)

// rooms are the other hypervisors' directories: mem, a new hypervisor,
// needs none of them, its tests included.
var rooms = []string{
	"github.com/bigfleet-vm/provider/hypervisors/libvirt",
	"github.com/bigfleet-vm/provider/hypervisors/proxmox",
}

// TestImportsNoOtherRoom: nothing mem builds on, its tests included
// (go list -deps -test), is under another hypervisor's room.
func TestImportsNoOtherRoom(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps -test: %v", err)
	}
	deps := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(deps) < 10 {
		t.Fatalf("go list -deps -test listed %d packages; want mem's whole graph", len(deps))
	}
	for _, p := range deps {
		p, _, _ = strings.Cut(p, " ") // "p [mem.test]": p built for mem's tests
		for _, r := range rooms {
			if p == r || strings.HasPrefix(p, r+"/") {
				t.Errorf("mem depends on %s, in another hypervisor's room", p)
			}
		}
	}
}
