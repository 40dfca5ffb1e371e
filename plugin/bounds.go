package plugin

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Bounds are a plug-in's rows of the bounded numeric flags' tables; the
// core merges them with its own (config.Bounds).
type Bounds struct {
	Durations map[string]DurationBound
	Ints      map[string]IntBound
}

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

// ParseArgv splits a comma-separated argv flag value; empty elements are
// errors.
func ParseArgv(s string) ([]string, error) {
	argv := strings.Split(s, ",")
	for i, a := range argv {
		if strings.TrimSpace(a) == "" {
			return nil, fmt.Errorf("%q has an empty element at position %d; write the argv as program,arg1,arg2 (arguments cannot contain commas)", s, i)
		}
	}
	return argv, nil
}
