// Package observed holds what the provider last saw on its hypervisors: per
// zone, the VMs (ours and foreign), the volumes that carry our prefix, and
// whether the zone could be read at all.
//
// Invariants the planner relies on:
//   - A zone whose listing failed has Status Unknown and no VMs; it is never
//     reported as an empty zone, so nothing is created or destroyed there.
//   - Owned VMs are indexed by the machine id in their ownership marker.
//     Observers set Marker for any VM carrying a BigFleet marker, whatever
//     installation it names; VM.Owned filters by installation. A VM with no
//     marker at all has Marker == nil.
//   - Values are plain data: they can be copied, compared and written to
//     golden files.
package observed
