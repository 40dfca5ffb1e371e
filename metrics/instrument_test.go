package metrics

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/libvirtsim"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/proxmoxsim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvespec"
)

// hvCalls reads hypervisor_calls_total as "op outcome" -> count.
func hvCalls(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	return series(t, m, "bigfleet_provider_hypervisor_calls_total", func(l map[string]string) string { return l["op"] + " " + l["outcome"] })
}

// newLibvirt is the real libvirt adapter with one zone whose socket does
// not exist: it is built without a daemon, and its steps fail fast.
func newLibvirt(t *testing.T) *libvirt.Hypervisor {
	t.Helper()
	h, err := libvirt.New(libvirt.Config{Installation: "i", Zones: []libvirt.ZoneURI{
		{Zone: "dead", URI: "qemu:///system?socket=" + filepath.Join(t.TempDir(), "none.sock")},
	}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// newProxmox is the real Proxmox adapter against the PVE simulator.
func newProxmox(t *testing.T) *proxmox.Adapter {
	t.Helper()
	const token, secret = "bigfleet@pve!ci", "5e1c7c1e-0000-4000-8000-00000000beef"
	sim := pvesim.New(pvesim.Options{Nodes: []string{"pve1"}, Latencies: pvesim.ZeroLatency()})
	sim.AddToken(pvesim.Token{ID: token, Secret: secret, ACL: pvesim.FullAccess()})
	srv := sim.NewTLSServer()
	t.Cleanup(func() { srv.Close(); sim.Close() })
	sum := sha256.Sum256(srv.Certificate().Raw)
	a, err := proxmox.New(proxmox.Config{APIURL: srv.URL + "/api2/json", TokenID: token, TokenSecret: secret,
		Fingerprint: hex.EncodeToString(sum[:]), Nodes: []string{"pve1"}, Installation: "i", PollInterval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// commonOnly offers only the common interface.
type commonOnly struct{ hypervisors.Hypervisor }

// An instrumented adapter offers, through its Capabilities and
// hypervisors.Find, exactly the optional interfaces the adapter has, and
// the steps of its vocabulary (Apply) are counted under each step's op.
// One wrapper type serves every adapter.
func TestInstrumentForwardsShapes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lv, px := newLibvirt(t), newProxmox(t)
	fakeLv, fakePx := libvirtsim.NewLibvirt(libvirtsim.Options{}), proxmoxsim.NewProxmox(proxmoxsim.Options{})
	defer fakeLv.Close()
	defer fakePx.Close()
	deleteVolume := func(zone string) func(hypervisors.Hypervisor) {
		return func(w hypervisors.Hypervisor) {
			_, _ = w.Apply(ctx, hypervisors.Target{Zone: zone}, &lvspec.DeleteVolume{Pool: "default", Volume: "bf-gone"})
		}
	}
	deleteVM := func(zone string) func(hypervisors.Hypervisor) {
		return func(w hypervisors.Hypervisor) {
			_, _ = w.Apply(ctx, hypervisors.Target{Zone: zone, VMID: 4242}, &pvespec.DeleteVM{})
		}
	}
	tests := []struct {
		name   string
		hv     hypervisors.Hypervisor
		offers map[string]bool
		calls  []func(hypervisors.Hypervisor)
		// counted lists the op labels the calls must add.
		counted []string
	}{
		{"libvirt adapter", lv,
			map[string]bool{"events": true, "volumes": true, "health": true},
			[]func(hypervisors.Hypervisor){deleteVolume("dead")}, []string{"delete_volume"}},
		{"proxmox adapter", px,
			map[string]bool{"events": true, "health": true},
			[]func(hypervisors.Hypervisor){deleteVM("pve1")}, []string{"delete_vm"}},
		{"libvirt simulator", fakeLv,
			map[string]bool{"volumes": true, "health": true},
			[]func(hypervisors.Hypervisor){deleteVolume("fake-a")}, []string{"delete_volume"}},
		{"proxmox simulator", fakePx,
			map[string]bool{"health": true},
			[]func(hypervisors.Hypervisor){deleteVM("fake-a")}, []string{"delete_vm"}},
		// A step of another vocabulary is refused by the adapter, and
		// still counted (as an error) under its op.
		{"proxmox step on libvirt", fakeLv,
			map[string]bool{"volumes": true, "health": true},
			[]func(hypervisors.Hypervisor){deleteVM("fake-a")}, []string{"delete_vm"}},
		// The wrapper offers no part the adapter lacks.
		{"common interface only", commonOnly{fakeLv}, map[string]bool{}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New(nil, nil)
			w := Instrument(tc.hv, m)
			offers := map[string]bool{}
			for name, ok := range map[string]bool{
				"events":  found[hypervisors.EventSource](w),
				"volumes": found[hypervisors.VolumeReader](w),
				"health":  found[hypervisors.HealthReporter](w),
			} {
				if ok {
					offers[name] = true
				}
			}
			if d := cmp.Diff(tc.offers, offers); d != "" {
				t.Errorf("interfaces offered (-want +got):\n%s", d)
			}
			caps := hypervisors.CapabilitiesOf(w)
			declared := map[string]bool{}
			for name, part := range map[string]any{"events": caps.Events, "volumes": caps.Volumes, "health": caps.Health} {
				if part != nil {
					declared[name] = true
				}
			}
			if d := cmp.Diff(tc.offers, declared); d != "" {
				t.Errorf("Capabilities of the wrapper (-want +got):\n%s", d)
			}
			if es, ok := hypervisors.Find[hypervisors.EventSource](w); ok {
				raw, _ := tc.hv.(hypervisors.EventSource)
				if es.Events() != raw.Events() {
					t.Error("the events found are not the adapter's")
				}
			}
			for _, call := range tc.calls {
				call(w)
			}
			got := map[string]bool{}
			for k, n := range hvCalls(t, m) {
				if op, _, _ := strings.Cut(k, " "); n > 0 {
					got[op] = true
				}
			}
			want := map[string]bool{}
			for _, op := range tc.counted {
				want[op] = true
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("counted calls, by op (-want +got):\n%s", d)
			}
		})
	}
}

func found[T any](hv hypervisors.Hypervisor) bool {
	_, ok := hypervisors.Find[T](hv)
	return ok
}

// reporting is an adapter that reports RPCs (as the libvirt adapter does).
type reporting struct {
	hypervisors.Hypervisor
	f func(zone, procedure string, d time.Duration, err error)
}

func (r *reporting) ObserveRPCs(f func(zone, procedure string, d time.Duration, err error)) { r.f = f }

func (r *reporting) Unwrap() hypervisors.Hypervisor { return r.Hypervisor }

// hvDurations reads hypervisor_call_duration_seconds sample counts as
// "op/zone/procedure" -> count.
func hvDurations(t *testing.T, m *Metrics) map[string]uint64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "bigfleet_provider_hypervisor_call_duration_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range mt.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["op"]+"/"+l["zone"]+"/"+l["procedure"]] = mt.GetHistogram().GetSampleCount()
		}
	}
	return out
}

// Call durations carry the zone of each operation (a slow host shows up
// on its own); the RPCs an adapter reports land under op="rpc" by
// procedure, without a zone (one series per procedure whatever the number
// of hosts), and its liveness probes under op="probe" by zone.
func TestCallDurationsByZoneAndProcedure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fk := libvirtsim.NewLibvirt(libvirtsim.Options{})
	defer fk.Close()
	r := &reporting{Hypervisor: fk}
	m := New(nil, nil)
	w := Instrument(r, m)
	if r.f == nil {
		t.Fatal("Instrument did not subscribe to the adapter's RPCs")
	}
	zones := fk.Zones()
	for _, z := range zones {
		if _, err := w.Observe(ctx, z); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = w.Apply(ctx, hypervisors.Target{Zone: zones[1]}, &lvspec.DeleteVolume{Pool: "default", Volume: "bf-gone"})
	r.f(zones[0], "DomainGetXMLDesc", 3*time.Millisecond, nil)
	r.f(zones[1], "DomainGetXMLDesc", 4*time.Millisecond, nil)
	r.f(zones[1], "", time.Millisecond, nil)
	want := map[string]uint64{
		"observe/" + zones[0] + "/":       1,
		"observe/" + zones[1] + "/":       1,
		"delete_volume/" + zones[1] + "/": 1,
		"rpc//DomainGetXMLDesc":           2,
		"probe/" + zones[1] + "/":         1,
	}
	if d := cmp.Diff(want, hvDurations(t, m)); d != "" {
		t.Errorf("duration series (-want +got):\n%s", d)
	}
}
