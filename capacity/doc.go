// Package capacity holds a zone's offerings against its host: what the
// offerings can place (every slot, SPECULATIVE or not, times its
// instance type's vCPUs and memory) and what already runs (the slots not
// SPECULATIVE), against the capacity the hypervisor reports for the zone
// (hypervisors.CapacityReader). Compare and Sum are pure; Read asks the
// adapter, one zone at a time within a bound. Latest keeps each zone's
// newest reading (one per zone), and Fit holds one more machine against
// it: memory physically, vCPUs within the host's CPUs times the
// overcommit ratio; a shortage is a Short, whose message names the
// resource with the figures (a machine's last_error).
package capacity
