package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bigfleet-vm/provider/config"
)

// TestAdminInputValidatedLikeTheWire sends the simulator's admin
// endpoints what the wire refuses: each answers 400 naming the problem,
// and the world, the plan and the state are as before. Before, a negative
// size was applied, a 300-byte id left a permanent "adopt" in every plan,
// and a name that is not UTF-8 made every List answer Internal and the
// state unreadable.
func TestAdminInputValidatedLikeTheWire(t *testing.T) {
	long := strings.Repeat("m", 300)
	for _, shape := range []struct {
		name  string
		args  []string
		cases []struct{ query, want string }
	}{
		{name: "libvirt", args: nil, cases: []struct{ query, want string }{
			{"resize?zone=local-a&name=vm1&vcpu=-1&memory_mib=2048", "vcpu must be positive, got -1"},
			{"resize?zone=local-a&name=vm1&vcpu=2&memory_mib=-5", "memory_mib must be positive, got -5"},
			{"resize?zone=local-a&name=vm1&vcpu=5000&memory_mib=2048", "vcpu 5000 is above the cap of 1024"},
			{"resize?zone=local-a&name=vm1&vcpu=two&memory_mib=2048", `vcpu "two" is not an integer`},
			{"add-owned?zone=local-a&name=orphan&id=" + long + "&instance_type=kvm.small", "machine id is 300 bytes; the cap is 256"},
			{"add-owned?zone=local-a&name=orphan&id=&instance_type=kvm.small", "machine id is empty"},
			{"add-owned?zone=local-a&name=orphan&id=x&instance_type=a%20b", `instance type name "a b" contains whitespace`},
			{"add-owned?zone=local-a&name=%ff%fe&id=x", "is not valid UTF-8"},
			{"add-foreign?zone=local-a&name=%ff", "is not valid UTF-8"},
			{"add-foreign?zone=local-a&name=" + long, "name is 300 bytes; the cap is 256"},
			{"add-foreign?zone=local-a", "name is empty"},
			{"stop?machine=" + long + "x", "machine is 301 bytes; the cap is 256"},
		}},
		{name: "proxmox", args: []string{"--hypervisor", "proxmox"}, cases: []struct{ query, want string }{
			{"add-foreign?zone=pve-a&vmid=-3&name=x", "vmid -3 is outside the Proxmox VMID range"},
			{"add-foreign?zone=pve-a&vmid=1x&name=x", `vmid "1x" is not an integer`},
			{"add-foreign?zone=pve-a&vmid=150&name=%ff", "is not valid UTF-8"},
			{"add-owned?zone=pve-a&name=orphan&id=" + long, "machine id is 300 bytes; the cap is 256"},
			{"resize?zone=pve-a&vmid=150&vcpu=2&memory_mib=0", "memory_mib must be positive, got 0"},
		}},
	} {
		t.Run(shape.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			args := append([]string{"--use-fake-backend", "--fake-admin", "--seed-count", "2", "--state", state,
				"--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--reconcile-interval", "0"}, shape.args...)
			build := func() *Provider {
				cfg, err := config.Parse(testReg, args, io.Discard)
				if err != nil {
					t.Fatal(err)
				}
				p, err := Build(context.Background(), cfg, slog.New(slog.DiscardHandler))
				if err != nil {
					t.Fatalf("Build: %v", err)
				}
				return p
			}
			p := build()
			var serving atomic.Bool
			h := p.httpHandler(&serving)
			post := func(query string) (int, string) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/admin/"+query, nil))
				return rec.Code, rec.Body.String()
			}
			// A VM to resize: a valid admin call still works.
			vm := "add-foreign?zone=local-a&name=vm1"
			if shape.name == "proxmox" {
				vm = "add-foreign?zone=pve-a&vmid=150&name=vm1"
			}
			if code, body := post(vm); code != http.StatusOK {
				t.Fatalf("POST /admin/%s: %d %s", vm, code, body)
			}
			before := p.current().rec.Plan(context.Background())
			for _, c := range shape.cases {
				code, body := post(c.query)
				if code != http.StatusBadRequest || !strings.Contains(body, c.want) {
					t.Errorf("POST /admin/%.80s: %d %q, want 400 saying %q", c.query, code, body, c.want)
				}
			}
			after := p.current().rec.Plan(context.Background())
			if after.Summary != before.Summary || len(after.Drift) != len(before.Drift) {
				t.Errorf("the refused calls changed the plan: %+v, drift %v; before %+v, drift %v", after.Summary, after.Drift, before.Summary, before.Drift)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			// The state (the simulator's world included) opens again.
			p = build()
			defer p.Close()
			if again := p.current().rec.Plan(context.Background()); again.Summary.Adopt != 0 {
				t.Errorf("after a restart the plan adopts: %+v", again.Summary)
			}
		})
	}
}
