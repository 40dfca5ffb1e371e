// Package inventory models what this provider may provision: the
// instance-type catalog, the offerings (the quota, per zone and type), the
// price of each type, and the slots (machine ids) the offerings mint. It is
// pure: apart from reading a named JSON file it performs no I/O, and every
// function is deterministic.
//
// Invariants other packages rely on:
//   - A machine id is "<zone>/<instance_type>/<index>" with the index
//     zero-padded to at least three digits. It is a pure function of the
//     offering's zone and type and the slot's position, so ids are stable
//     across restarts, across reordering of offerings and across renaming
//     of the --provider label (which ids never embed). Shrinking an
//     offering drops its highest indices; growing it appends new ones.
//   - Validated offerings never share a (zone, instance_type) pair, so no
//     two slots share an id.
//   - Zone and instance-type names never contain '/', ':' or whitespace, so
//     ParseMachineID recovers exactly what MachineID encoded.
//   - Capacity types are canonical after validation (OnDemand or
//     BareMetal); a process never mixes the two, and one whose hypervisor
//     cannot offer bare metal (CapacityRules) only ever holds OnDemand.
//   - What differs between hypervisors (built-in type names, the
//     template_vmid key, the capacity types offered and their wording)
//     comes in CatalogRules and CapacityRules from the hypervisor's
//     plug-in; inventory never asks which hypervisor it serves.
//   - Slots returned by Slots are sorted by ID (byte-wise), so callers may
//     binary-search them.
package inventory
