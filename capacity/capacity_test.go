package capacity

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bigfleet-vm/provider/hypervisors"
)

func spec(name string) (int, int, bool) {
	switch name {
	case "small":
		return 2, 4096, true
	case "large":
		return 8, 16384, true
	}
	return 0, 0, false
}

func TestCompare(t *testing.T) {
	hosts := map[string]hypervisors.HostCapacity{
		"a": {MemoryBytes: 64 << 30, CPUs: 16},
		"b": {MemoryBytes: 32 << 30, CPUs: 8},
	}
	var slots []Slot
	for i := 0; i < 40; i++ { // 40 × 4 GiB on a 64 GiB host: the case
		slots = append(slots, Slot{Zone: "a", InstanceType: "small", Running: i < 3})
	}
	slots = append(slots,
		Slot{Zone: "b", InstanceType: "large", Running: true},
		Slot{Zone: "b", InstanceType: "unknown"}, // not in the catalog: left out
		Slot{Zone: "c", InstanceType: "large"},   // no reading for c
	)
	got := Compare(hosts, slots, spec)
	want := []Zone{
		{Zone: "a", Host: hosts["a"], Offered: Usage{VCPU: 80, MemoryBytes: 160 << 30}, Running: Usage{VCPU: 6, MemoryBytes: 12 << 30}},
		{Zone: "b", Host: hosts["b"], Offered: Usage{VCPU: 8, MemoryBytes: 16 << 30}, Running: Usage{VCPU: 8, MemoryBytes: 16 << 30}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Compare (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		z        Zone
		resource string
		ratio    float64
	}{
		{got[0], CPU, 5}, {got[0], Memory, 2.5}, {got[1], CPU, 1}, {got[1], Memory, 0.5},
		{Zone{Offered: Usage{VCPU: 4}}, CPU, 0}, // host unknown
	} {
		if r := tc.z.Ratio(tc.resource); r != tc.ratio {
			t.Errorf("%s %s ratio %v, want %v", tc.z.Zone, tc.resource, r, tc.ratio)
		}
	}
	if diff := cmp.Diff([]string{CPU, Memory}, got[0].Over(0)); diff != "" {
		t.Errorf("a over 1 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{CPU}, got[0].Over(3)); diff != "" {
		t.Errorf("a over 3 (-want +got):\n%s", diff)
	}
	if over := got[1].Over(0); over != nil {
		t.Errorf("b is exactly full, not over (0 means 1): %v", over)
	}
}

type reader map[string]any // zone -> HostCapacity, error, or nil to hang

func (r reader) ReadCapacity(ctx context.Context, zone string) (hypervisors.HostCapacity, error) {
	switch v := r[zone].(type) {
	case hypervisors.HostCapacity:
		return v, nil
	case error:
		return hypervisors.HostCapacity{}, v
	}
	<-ctx.Done()
	return hypervisors.HostCapacity{}, ctx.Err()
}

// TestRead: a failed, a silent and an empty zone are absent from the
// hosts; the first two have their error, and the silent one is bounded.
func TestRead(t *testing.T) {
	h := hypervisors.HostCapacity{MemoryBytes: 1 << 30, CPUs: 1}
	boom := errors.New("boom")
	hosts, errs := Read(context.Background(), reader{"ok": h, "bad": boom, "hang": nil, "none": hypervisors.HostCapacity{}},
		[]string{"ok", "bad", "hang", "none"}, 50*time.Millisecond)
	if diff := cmp.Diff(map[string]hypervisors.HostCapacity{"ok": h}, hosts); diff != "" {
		t.Errorf("hosts (-want +got):\n%s", diff)
	}
	if !errors.Is(errs["bad"], boom) || !errors.Is(errs["hang"], context.DeadlineExceeded) || len(errs) != 2 {
		t.Errorf("errs %v, want bad: boom and hang: deadline", errs)
	}
}

// TestLatestKeepsTheNewestReadingPerZone: a read's outcome replaces the
// zone's previous reading; a failed read is kept as the error, not as the
// old figures.
func TestLatestKeepsTheNewestReadingPerZone(t *testing.T) {
	var l Latest
	if _, ok := l.Get("a"); ok {
		t.Fatal("a reading before any read")
	}
	t0 := time.Unix(1, 0)
	h := hypervisors.HostCapacity{MemoryBytes: 1 << 30, CPUs: 1}
	l.Record([]string{"a", "b"}, map[string]hypervisors.HostCapacity{"a": h}, nil, t0)
	boom := errors.New("boom")
	l.Record([]string{"a"}, nil, map[string]error{"a": boom}, t0.Add(time.Second))
	if r, _ := l.Get("a"); r.Err != boom || r.Host != (hypervisors.HostCapacity{}) || !r.At.Equal(t0.Add(time.Second)) {
		t.Errorf("a after a failed read: %+v", r)
	}
	if r, ok := l.Get("b"); !ok || r.Err != nil || r.Host != (hypervisors.HostCapacity{}) {
		t.Errorf("b (reported nothing): %+v %v", r, ok)
	}
}

// TestFit: memory fits physically, vCPUs within CPUs × ratio; a figure
// the host did not report is not checked.
func TestFit(t *testing.T) {
	host := hypervisors.HostCapacity{CPUs: 4, MemoryBytes: 8 << 30}
	need := Usage{VCPU: 2, MemoryBytes: 4 << 30}
	for _, tc := range []struct {
		name  string
		host  hypervisors.HostCapacity
		used  Usage
		ratio float64
		want  string
	}{
		{"fits", host, Usage{VCPU: 2, MemoryBytes: 4 << 30}, 1, ""},
		{"memory", host, Usage{MemoryBytes: 5 << 30}, 4, "host memory: zone z has 3072 MiB free, the machine needs 4096 MiB"},
		{"memory over the host already", host, Usage{MemoryBytes: 9 << 30}, 1, "host memory: zone z has 0 MiB free, the machine needs 4096 MiB"},
		{"cpu", host, Usage{VCPU: 3}, 1, "host cpu: zone z has 1 vCPUs free (4 CPUs × overcommit 1), the machine needs 2 vCPUs"},
		{"cpu within the ratio", host, Usage{VCPU: 4}, 1.5, ""},
		{"ratio 0 means 1", host, Usage{VCPU: 3}, 0, "host cpu: zone z has 1 vCPUs free (4 CPUs × overcommit 1), the machine needs 2 vCPUs"},
		{"nothing reported", hypervisors.HostCapacity{}, Usage{VCPU: 100, MemoryBytes: 100 << 30}, 1, ""},
	} {
		got := ""
		if s := Fit("z", tc.host, tc.used, need, tc.ratio); s != nil {
			got = s.Error()
			if !errors.Is(s, ErrShort) {
				t.Errorf("%s: not ErrShort", tc.name)
			}
		}
		if got != tc.want {
			t.Errorf("%s: Fit = %q, want %q", tc.name, got, tc.want)
		}
	}
}
