package e2e

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/bigfleet-vm/provider/api/bigfleet/v1alpha1"
	"github.com/bigfleet-vm/provider/internal/providertest"
)

func TestBareMetal(t *testing.T) {
	eachShape(t, func(t *testing.T, sh shape) {
		if sh.name == "proxmox" {
			// Proxmox VMs are deletable clones: a bare_metal pool is refused
			// at startup with a reason.
			out, code := runExit(t, append(sh.args, "--offerings", offeringsFile(t, sh, "bare_metal", 4, nil))...)
			if code == 0 || !strings.Contains(out, "bare_metal") {
				t.Errorf("proxmox with a bare_metal offering: exit %d, output:\n%s", code, out)
			}
			return
		}
		s := start(t, append(sh.args, "--seed-count", "4", "--capacity-type", "bare_metal")...)
		ms := providertest.ListAll(t, s.c)
		for _, m := range ms {
			checkShape(t, m, sh.name)
			if m.CapacityType != pb.CapacityType_CAPACITY_TYPE_BARE_METAL || m.PricePerHour != 0 {
				t.Errorf("%s: capacity %v price %v, want BARE_METAL and 0", m.Id, m.CapacityType, m.PricePerHour)
			}
		}
		id := ms[0].Id
		toIdle(t, s.c, id)
		_, err := del(s.c, t, id, tok{})
		if code(err) != codes.Unimplemented {
			t.Errorf("Delete on bare_metal IDLE: %v, want Unimplemented", err)
		}
		providertest.Holds(t, s.c, id, providertest.StIdle, 300*time.Millisecond)
		if m := providertest.Get(t, s.c, id); m.PricePerHour != 0 || m.Host == nil {
			t.Errorf("bare_metal IDLE machine: price %v host %v", m.PricePerHour, m.Host)
		}
	})
}
