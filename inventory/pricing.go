package inventory

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/hashicorp/go-multierror"
)

// Default synthetic rates, in USD per hour.
const (
	DefaultPricePerVCPUHour = 0.0030
	DefaultPricePerGiBHour  = 0.0008
)

// Pricing prices instance types. Prices are a relative ranking signal for
// the engine, not an invoice. A type with an explicit price uses it;
// otherwise the price is VCPU*PerVCPUHour + GiB*PerGiBHour. BareMetal
// capacity is always free (owned hardware).
type Pricing struct {
	PerVCPUHour float64            `json:"per_vcpu_hour"`
	PerGiBHour  float64            `json:"per_gib_hour"`
	Explicit    map[string]float64 `json:"explicit,omitempty"`
}

// NewPricing validates the synthetic rates (finite, >= 0 and at most
// MaxPricePerHour; zero is a legitimate "this dimension is free") and
// returns the pricing.
func NewPricing(perVCPUHour, perGiBHour float64, explicit map[string]float64) (Pricing, error) {
	var errs *multierror.Error
	for _, r := range []struct {
		name string
		v    float64
	}{{"per-vCPU rate", perVCPUHour}, {"per-GiB rate", perGiBHour}} {
		if err := validPrice(r.v); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("%s: %w", r.name, err))
		}
	}
	if err := finish(errs); err != nil {
		return Pricing{}, err
	}
	return Pricing{PerVCPUHour: perVCPUHour, PerGiBHour: perGiBHour, Explicit: explicit}, nil
}

func validPrice(v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%v is not a finite number", v)
	}
	if v < 0 {
		return fmt.Errorf("%v is negative; prices must be >= 0", v)
	}
	if v > MaxPricePerHour {
		return fmt.Errorf("%v is above the cap of %d USD/hour", v, MaxPricePerHour)
	}
	return nil
}

// ParsePrices parses "type=usd,type=usd" into explicit per-hour prices.
// Empty entries are skipped; every other entry must be name=price with a
// finite, non-negative price of at most MaxPricePerHour and a name from the catalog, each at most
// once. An empty string yields nil. Every problem found is reported.
func ParsePrices(s string, c Catalog) (map[string]float64, error) {
	var errs *multierror.Error
	var prices map[string]float64
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, val, ok := strings.Cut(entry, "=")
		name, val = strings.TrimSpace(name), strings.TrimSpace(val)
		if !ok || name == "" || val == "" {
			errs = multierror.Append(errs, fmt.Errorf("entry %q must be type=usd, e.g. kvm.small=0.05", entry))
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("price %q for %s is not a number", val, name))
			continue
		}
		if err := validPrice(v); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("price for %s: %w", name, err))
			continue
		}
		if _, known := c[name]; !known {
			errs = multierror.Append(errs, fmt.Errorf("%q is not in the instance-type catalog (known: %s)", name, strings.Join(c.Names(), ", ")))
			continue
		}
		if _, dup := prices[name]; dup {
			errs = multierror.Append(errs, fmt.Errorf("%s is priced twice; keep one entry", name))
			continue
		}
		if prices == nil {
			prices = map[string]float64{}
		}
		prices[name] = v
	}
	if err := finish(errs); err != nil {
		return nil, err
	}
	return prices, nil
}

// Price is the USD/hour price of one machine of type it with capacity ct.
func (p Pricing) Price(it InstanceType, ct CapacityType) float64 {
	if ct == BareMetal {
		return 0
	}
	if v, ok := p.Explicit[it.Name]; ok {
		return v
	}
	return float64(it.VCPU)*p.PerVCPUHour + float64(it.MemoryMiB)/1024*p.PerGiBHour
}
