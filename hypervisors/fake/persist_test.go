package fake

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	loaders := map[hypervisors.Shape]func(path string, opts Options) (hypervisors.Hypervisor, error){
		hypervisors.ShapeLibvirt: func(p string, o Options) (hypervisors.Hypervisor, error) { return LoadLibvirt(p, o) },
		hypervisors.ShapeProxmox: func(p string, o Options) (hypervisors.Hypervisor, error) { return LoadProxmox(p, o) },
	}
	openers := map[hypervisors.Shape]func(opts Options) (hypervisors.Hypervisor, error){
		hypervisors.ShapeLibvirt: func(o Options) (hypervisors.Hypervisor, error) { return OpenLibvirt(o) },
		hypervisors.ShapeProxmox: func(o Options) (hypervisors.Hypervisor, error) { return OpenProxmox(o) },
	}
	for _, shape := range []hypervisors.Shape{hypervisors.ShapeLibvirt, hypervisors.ShapeProxmox} {
		t.Run(string(shape)+"/save-load", func(t *testing.T) {
			ctx := context.Background()
			b := buildRunning(t, shape, Options{}, "c-1")
			if err := b.h.AgentWriteFile(ctx, b.t, b.blobPath, secret, 0o600); err != nil {
				t.Fatal(err)
			}
			if r, err := b.h.AgentExec(ctx, b.t, b.bootstrap); err != nil || r.ExitCode != 0 {
				t.Fatalf("bootstrap: %+v, %v", r, err)
			}
			path := filepath.Join(t.TempDir(), "s.db.fake.json")
			var err error
			switch f := b.h.(type) {
			case *Libvirt:
				err = f.Save(path)
			case *Proxmox:
				err = f.Save(path)
			}
			if err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(path)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("saved file: %v, %v", st, err)
			}
			data, _ := os.ReadFile(path)
			if bytes.Contains(data, secret) {
				t.Error("the saved world contains the blob")
			}
			h2, err := loaders[shape](path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer h2.Close()
			if d := cmp.Diff(observeAll(t, b.h), observeAll(t, h2), ignoreAt); d != "" {
				t.Errorf("reloaded world (-want +got)\n%s", d)
			}
			// The guest kept its history (without the blob) and is still
			// a bootstrapped node.
			r, err := h2.AgentExec(ctx, b.t, []string{DefaultReadyCommand})
			if err != nil || r.ExitCode != 0 {
				t.Errorf("ready after reload: %+v, %v", r, err)
			}
			if _, err := loaders[otherShape(shape)](path, Options{}); err == nil {
				t.Error("loading a world of the other shape succeeded")
			}
		})

		t.Run(string(shape)+"/persist-path", func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "s.db.fake.json")
			opts := Options{PersistPath: path, PersistDebounce: time.Millisecond}
			h, err := openers[shape](opts)
			if err != nil {
				t.Fatal(err)
			}
			target := place(t, h)
			// The debounced save lands without Close.
			deadline := time.Now().Add(5 * time.Second)
			for {
				if _, err := os.Stat(path); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no debounced save")
				}
				time.Sleep(time.Millisecond)
			}
			if err := h.Stop(ctx, target, 0); err != nil {
				t.Fatal(err)
			}
			want := observeAll(t, h)
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			h2, err := openers[shape](opts)
			if err != nil {
				t.Fatal(err)
			}
			defer h2.Close()
			if d := cmp.Diff(want, observeAll(t, h2), ignoreAt); d != "" {
				t.Errorf("restarted world (-want +got)\n%s", d)
			}
		})

		t.Run(string(shape)+"/read-only", func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "s.db.fake.json")
			h, err := openers[shape](Options{PersistPath: path})
			if err != nil {
				t.Fatal(err)
			}
			target := place(t, h)
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(path)
			ro, err := loaders[shape](path, Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			if z := observeAll(t, ro); len(z[target.Zone].VMs) == 0 {
				t.Error("read-only world observed empty")
			}
			errIs(t, "stop", ro.Stop(ctx, target, 0), hypervisors.ErrPermission)
			errIs(t, "marker", ro.SetMarker(ctx, target, marker("m-1", "")), hypervisors.ErrPermission)
			if err := ro.Close(); err != nil {
				t.Fatal(err)
			}
			after, _ := os.ReadFile(path)
			if !bytes.Equal(before, after) {
				t.Error("read-only simulator rewrote the world")
			}
		})
	}
}

func otherShape(s hypervisors.Shape) hypervisors.Shape {
	if s == hypervisors.ShapeLibvirt {
		return hypervisors.ShapeProxmox
	}
	return hypervisors.ShapeLibvirt
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

func TestOpenWithoutPath(t *testing.T) {
	if _, err := OpenLibvirt(Options{}); err == nil {
		t.Error("OpenLibvirt without PersistPath succeeded")
	}
	if _, err := OpenProxmox(Options{}); err == nil {
		t.Error("OpenProxmox without PersistPath succeeded")
	}
}
