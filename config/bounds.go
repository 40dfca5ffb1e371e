package config

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/bigfleet-vm/provider/inventory"
)

// DurationBound is the range a duration flag accepts.
type DurationBound struct {
	Min, Max time.Duration
	// Off also accepts 0, which turns the feature off (Min > 0).
	Off bool
	// Unit, when set, is what the value must be a whole multiple of (etcd
	// leases count whole seconds).
	Unit time.Duration
	// Why is said after the range when a value is refused.
	Why string
}

// IntBound is the range an integer flag accepts.
type IntBound struct {
	Min, Max int
	Why      string
}

// FloatBound is the range a number flag accepts (finite, NaN refused).
type FloatBound struct {
	Min, Max float64
	Why      string
}

// The bounds of every bounded numeric flag. This is the one place the
// binary takes them from; deploy/helm/values.schema.json carries the same
// numbers for the chart values that become these flags, and
// deploy/chart_test.go checks the schema against these tables and renders
// every bound (just inside, just outside) through Parse.
var (
	DurationBounds = map[string]DurationBound{
		// A pass lists every host: more than two a second (the loop's
		// spacing of passes asked for by events) only burns CPU.
		"reconcile-interval": {Min: 500 * time.Millisecond, Max: 24 * time.Hour, Off: true,
			Why: "a full pass lists every host; 0 turns background passes off"},
		"leader-lease":          {Min: 2 * time.Second, Max: time.Minute, Unit: time.Second, Why: "etcd leases count whole seconds"},
		"proxmox-poll-interval": {Min: 250 * time.Millisecond, Max: time.Minute, Off: true, Why: "each poll makes PVE build a listing of every VM"},
		"drift-repair-delay":    {Min: 0, Max: time.Hour, Why: "0 repairs at once"},
		"repair-timeout":        {Min: time.Second, Max: time.Hour, Why: "a drift repair gives up after this long and is retried with backoff"},
		"create-timeout":        {Min: time.Second, Max: 24 * time.Hour},
		"configure-timeout":     {Min: time.Second, Max: 24 * time.Hour},
		"drain-timeout":         {Min: time.Second, Max: 24 * time.Hour},
		"delete-timeout":        {Min: time.Second, Max: 24 * time.Hour},
		"shutdown-grace":        {Min: 0, Max: time.Hour},
		"fake-latency":          {Min: 0, Max: time.Minute, Why: "0 is instant"},
		"history-retention":     {Min: time.Minute, Max: 30 * 24 * time.Hour, Why: "how long a removed machine's history is kept"},
		"libvirt-call-timeout":  {Min: time.Second, Max: time.Minute, Why: "one libvirt RPC; keep it well below the 30s observe budget"},
	}
	IntBounds = map[string]IntBound{
		"seed-count":              {Min: 1, Max: inventory.MaxSlots, Why: "each slot costs memory and state; split a larger host-set across providers"},
		"max-concurrent-per-zone": {Min: 1, Max: 1024},
		"template-vmid":           {Min: inventory.MinVMID, Max: inventory.MaxVMID, Why: "the Proxmox VMID range"},
		"repair-attempts":         {Min: 1, Max: 100, Why: "attempts per step of a drift repair before it is retried with backoff"},
		"history-events":          {Min: 1, Max: 1000, Why: "events kept per machine; every commit of a machine rewrites its ring"},
		"history-total-events":    {Min: 1000, Max: 10_000_000, Why: "events kept for all machines together, about 200 bytes each in memory and in the state"},
	}
	FloatBounds = map[string]FloatBound{
		"price-per-vcpu-hour": {Min: 0, Max: inventory.MaxPricePerHour, Why: "0 makes that dimension free"},
		"price-per-gib-hour":  {Min: 0, Max: inventory.MaxPricePerHour, Why: "0 makes that dimension free"},
	}
)

// Check says why d is outside b, or nil.
func (b DurationBound) Check(d time.Duration) error {
	if b.Off && d == 0 {
		return nil
	}
	inside := d >= b.Min && d <= b.Max && (b.Unit == 0 || d%b.Unit == 0)
	if inside {
		return nil
	}
	what := fmt.Sprintf("between %s and %s", b.Min, b.Max)
	if b.Unit == time.Second {
		what = "whole seconds " + what
	}
	if b.Off {
		what = "0 (off) or " + what
	}
	return boundErr(what, d.String(), b.Why)
}

// Check says why n is outside b, or nil.
func (b IntBound) Check(n int) error {
	if n >= b.Min && n <= b.Max {
		return nil
	}
	return boundErr(fmt.Sprintf("between %d and %d", b.Min, b.Max), fmt.Sprint(n), b.Why)
}

// Check says why v is outside b, or nil.
func (b FloatBound) Check(v float64) error {
	if !math.IsNaN(v) && !math.IsInf(v, 0) && v >= b.Min && v <= b.Max {
		return nil
	}
	if b.Max == math.MaxFloat64 {
		return boundErr(fmt.Sprintf("a finite number >= %v", b.Min), fmt.Sprint(v), b.Why)
	}
	return boundErr(fmt.Sprintf("a finite number from %s to %s", strconv.FormatFloat(b.Min, 'f', -1, 64), strconv.FormatFloat(b.Max, 'f', -1, 64)), fmt.Sprint(v), b.Why)
}

func boundErr(what, got, why string) error {
	if why != "" {
		return fmt.Errorf("must be %s, got %s (%s)", what, got, why)
	}
	return fmt.Errorf("must be %s, got %s", what, got)
}

// duration, integer and number add a problem when the flag's value is
// outside its bound (which must be in the tables) and report whether it
// is inside.
func (p *problems) duration(name string, d time.Duration) bool {
	b, ok := DurationBounds[name]
	if !ok {
		panic("config: no bound for --" + name)
	}
	if err := b.Check(d); err != nil {
		p.add(name, "%v", err)
		return false
	}
	return true
}

func (p *problems) integer(name string, n int) bool {
	b, ok := IntBounds[name]
	if !ok {
		panic("config: no bound for --" + name)
	}
	if err := b.Check(n); err != nil {
		p.add(name, "%v", err)
		return false
	}
	return true
}

func (p *problems) number(name string, v float64) bool {
	b, ok := FloatBounds[name]
	if !ok {
		panic("config: no bound for --" + name)
	}
	if err := b.Check(v); err != nil {
		p.add(name, "%v", err)
		return false
	}
	return true
}
