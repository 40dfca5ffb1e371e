package providertest

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Metric sums the samples of metric name in a Prometheus text exposition
// whose line contains every given label pair (`op="clone_vm"`); 0 when
// none does.
func Metric(body, name string, labels ...string) float64 {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// Metric reads /metrics of the running provider and sums metric name's
// samples with every given label pair (see the function Metric).
func (p *Provider) Metric(name string, labels ...string) float64 {
	p.t.Helper()
	_, body := p.HTTPGet("/metrics")
	return Metric(body, name, labels...)
}

// WaitMetric waits, for at most max, until read's value satisfies ok;
// else it fails the test naming what and the last value.
func WaitMetric(t testing.TB, what string, read func() float64, ok func(float64) bool, max time.Duration) float64 {
	t.Helper()
	deadline := time.Now().Add(max)
	for {
		v := read()
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v after %v", what, v, max)
		}
		time.Sleep(pollEvery)
	}
}
