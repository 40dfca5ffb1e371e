package config

import (
	"maps"
	"time"

	"github.com/bigfleet-vm/provider/inventory"
	"github.com/bigfleet-vm/provider/plugin"
)

// The bound types are the plug-ins' (plugin.Bounds); config holds the
// core's rows and merges every plug-in's (Bounds).
type (
	DurationBound = plugin.DurationBound
	IntBound      = plugin.IntBound
	FloatBound    = plugin.FloatBound
)

// The bounds of the core's bounded numeric flags; a plug-in's flags have
// theirs in its Flags.Bounds, and Bounds merges both. This is the one
// place the binary takes them from; deploy/helm/values.schema.json carries the same
// numbers for the chart values that become these flags, and
// deploy/chart_test.go checks the schema against these tables and renders
// every bound (just inside, just outside) through Parse.
var (
	DurationBounds = map[string]DurationBound{
		// A pass lists every host: more than two a second (the loop's
		// spacing of passes asked for by events) only burns CPU.
		"reconcile-interval": {Min: 500 * time.Millisecond, Max: 24 * time.Hour, Off: true,
			Why: "a full pass lists every host; 0 turns background passes off"},
		"leader-lease":       {Min: 2 * time.Second, Max: time.Minute, Unit: time.Second, Why: "etcd leases count whole seconds"},
		"drift-repair-delay": {Min: 0, Max: time.Hour, Why: "0 repairs at once"},
		"repair-timeout":     {Min: time.Second, Max: time.Hour, Why: "a drift repair gives up after this long and is retried with backoff"},
		"create-timeout":     {Min: time.Second, Max: 24 * time.Hour},
		"configure-timeout":  {Min: time.Second, Max: 24 * time.Hour},
		"drain-timeout":      {Min: time.Second, Max: 24 * time.Hour},
		"delete-timeout":     {Min: time.Second, Max: 24 * time.Hour},
		"shutdown-grace":     {Min: 0, Max: time.Hour},
		"fake-latency":       {Min: 0, Max: time.Minute, Why: "0 is instant"},
		"history-retention":  {Min: time.Minute, Max: 30 * 24 * time.Hour, Why: "how long a removed machine's history is kept"},
	}
	IntBounds = map[string]IntBound{
		"seed-count":              {Min: 1, Max: inventory.MaxSlots, Why: "each slot costs memory and state; split a larger host-set across providers"},
		"max-concurrent-per-zone": {Min: 1, Max: 1024},
		"repair-attempts":         {Min: 1, Max: 100, Why: "attempts per step of a drift repair before it is retried with backoff"},
		"history-events":          {Min: 1, Max: 1000, Why: "events kept per machine; every commit of a machine rewrites its ring"},
		"history-total-events":    {Min: 1000, Max: 10_000_000, Why: "events kept for all machines together, about 200 bytes each in memory and in the state"},
	}
	FloatBounds = map[string]FloatBound{
		"price-per-vcpu-hour": {Min: 0, Max: inventory.MaxPricePerHour, Why: "0 makes that dimension free"},
		"price-per-gib-hour":  {Min: 0, Max: inventory.MaxPricePerHour, Why: "0 makes that dimension free"},
	}
)

// Bounds returns every bounded numeric flag's bounds: the core's tables
// and the rows of every plug-in in reg.
func Bounds(reg *plugin.Registry) (map[string]DurationBound, map[string]IntBound, map[string]FloatBound) {
	d, i := maps.Clone(DurationBounds), maps.Clone(IntBounds)
	b := reg.Bounds()
	maps.Copy(d, b.Durations)
	maps.Copy(i, b.Ints)
	return d, i, maps.Clone(FloatBounds)
}

// duration, integer and number add a problem when the flag's value is
// outside its bound (which must be in the tables) and report whether it
// is inside.
func (p *problems) duration(name string, d time.Duration) bool {
	b, ok := DurationBounds[name]
	if !ok {
		b, ok = p.bounds.Durations[name]
	}
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
		b, ok = p.bounds.Ints[name]
	}
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
