package fake

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// observeAll observes every zone of h.
func observeAll(t *testing.T, h hypervisors.Hypervisor) map[string]*observed.Zone {
	t.Helper()
	out := map[string]*observed.Zone{}
	for _, z := range h.Zones() {
		o, err := h.Observe(context.Background(), z)
		if err != nil {
			t.Fatal(err)
		}
		out[z] = o
	}
	return out
}

func TestPersistence(t *testing.T) {
	secret := []byte("very-secret-join-token")
	openers := map[string]func(opts Options) (hypervisors.Hypervisor, error){
		"libvirt": func(o Options) (hypervisors.Hypervisor, error) { return OpenLibvirt(o) },
		"proxmox": func(o Options) (hypervisors.Hypervisor, error) { return OpenProxmox(o) },
	}
	for _, shape := range []string{"libvirt", "proxmox"} {
		t.Run(string(shape)+"/journal-reload", func(t *testing.T) {
			ctx := context.Background()
			mem := newJournal()
			b := buildRunning(t, shape, Options{Store: mem}, "c-1")
			if err := b.h.AgentWriteFile(ctx, b.t, b.blobPath, secret, 0o600); err != nil {
				t.Fatal(err)
			}
			if r, err := b.h.AgentExec(ctx, b.t, b.bootstrap); err != nil || r.ExitCode != 0 {
				t.Fatalf("bootstrap: %+v, %v", r, err)
			}
			if err := b.h.Stop(ctx, b.t, 0); err != nil {
				t.Fatal(err)
			}
			state := mem.Snapshot()
			for k, v := range state {
				if !strings.HasPrefix(k, StatePrefix) {
					t.Errorf("key %q outside %s", k, StatePrefix)
				}
				if bytes.Contains(v, secret) {
					t.Errorf("journaled %s contains the blob", k)
				}
			}
			h2, err := openers[shape](Options{State: state})
			if err != nil {
				t.Fatal(err)
			}
			defer h2.Close()
			if d := cmp.Diff(observeAll(t, b.h), observeAll(t, h2), ignoreAt); d != "" {
				t.Errorf("reloaded world (-want +got)\n%s", d)
			}
			// The guest kept its history (without the blob): once running
			// again it is still a bootstrapped node.
			if err := h2.Start(ctx, b.t); err != nil {
				t.Fatal(err)
			}
			r, err := h2.AgentExec(ctx, b.t, []string{DefaultReadyCommand})
			if err != nil || r.ExitCode != 0 {
				t.Errorf("ready after reload: %+v, %v", r, err)
			}
			// The other shape ignores this shape's records.
			other, err := openers[otherShape(shape)](Options{State: state})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			for z, obs := range observeAll(t, other) {
				for _, vm := range obs.VMs {
					if vm.Marker != nil {
						t.Errorf("other shape loaded %s in %s", vm.Name, z)
					}
				}
			}
		})

		t.Run(string(shape)+"/removal-is-journaled", func(t *testing.T) {
			mem := newJournal()
			h, err := openers[shape](Options{Store: mem})
			if err != nil {
				t.Fatal(err)
			}
			target := place(t, h)
			type remover interface {
				RemoveVM(hypervisors.Target) error
			}
			if err := h.(remover).RemoveVM(target); err != nil {
				t.Fatal(err)
			}
			h2, err := openers[shape](Options{State: mem.Snapshot()})
			if err != nil {
				t.Fatal(err)
			}
			defer h2.Close()
			if _, err := h2.Lookup(context.Background(), target); !errors.Is(err, hypervisors.ErrNotFound) {
				t.Errorf("removed VM came back: %v", err)
			}
		})

		t.Run(string(shape)+"/read-only", func(t *testing.T) {
			ctx := context.Background()
			mem := newJournal()
			h, err := openers[shape](Options{Store: mem})
			if err != nil {
				t.Fatal(err)
			}
			target := place(t, h)
			before := mem.Snapshot()
			ro, err := openers[shape](Options{State: before, Store: mem, ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			if z := observeAll(t, ro); len(z[target.Zone].VMs) == 0 {
				t.Error("read-only world observed empty")
			}
			errIs(t, "stop", ro.Stop(ctx, target, 0), hypervisors.ErrPermission)
			errIs(t, "marker", ro.SetMarker(ctx, target, marker("m-1", "")), hypervisors.ErrPermission)
			if d := cmp.Diff(before, mem.Snapshot()); d != "" {
				t.Errorf("read-only simulator journaled changes (-before +after)\n%s", d)
			}
		})
	}
}

func otherShape(s string) string {
	if s == "libvirt" {
		return "proxmox"
	}
	return "libvirt"
}

// place adds one running owned VM out of band and returns its target.
func place(t *testing.T, h hypervisors.Hypervisor) hypervisors.Target {
	t.Helper()
	zone := h.Zones()[0]
	switch f := h.(type) {
	case *Libvirt:
		if err := f.AddOwnedVM(zone, "bf-a", marker("m-1", ""), observed.PowerRunning); err != nil {
			t.Fatal(err)
		}
		return hypervisors.Target{Zone: zone, Name: "bf-a"}
	case *Proxmox:
		id, err := f.AddOwnedVM(zone, "bf-a", marker("m-1", ""), observed.PowerRunning)
		if err != nil {
			t.Fatal(err)
		}
		return hypervisors.Target{Zone: zone, Name: "bf-a", VMID: id}
	}
	t.Fatalf("unknown simulator %T", h)
	return hypervisors.Target{}
}

// journal is a Store that keeps the world's records in a map.
type journal struct {
	mu sync.Mutex
	m  map[string][]byte
}

func newJournal() *journal { return &journal{m: map[string][]byte{}} }

func (j *journal) Journal(key string, value []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if value == nil {
		delete(j.m, key)
		return
	}
	j.m[key] = append([]byte(nil), value...)
}

func (j *journal) Snapshot() map[string][]byte {
	j.mu.Lock()
	defer j.mu.Unlock()
	return maps.Clone(j.m)
}
