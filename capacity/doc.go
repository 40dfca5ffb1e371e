// Package capacity holds a zone's offerings against its host: what the
// offerings can place (every slot, SPECULATIVE or not, times its
// instance type's vCPUs and memory) and what already runs (the slots not
// SPECULATIVE), against the capacity the hypervisor reports for the zone
// (hypervisors.CapacityReader). Compare is pure; Read asks the adapter,
// one zone at a time within a bound.
package capacity
