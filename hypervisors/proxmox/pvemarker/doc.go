// Package pvemarker encodes the ownership marker of a Proxmox VM: the tag
// set (TagOwned, InstallationTag, MachineTag) and the machine-readable
// description line, and parses them back. The Proxmox adapter writes and
// reads VMs with it, the Proxmox simulator (proxmoxsim) keeps its
// VMs in the same form, and the planner checks a VM's tags with it.
//
// Invariants:
//   - ParseDescription(Description(m)) == m for every marker, whatever
//     its values contain (they are URL-encoded on one line), and whatever
//     other lines the operator added to the description.
//   - A description without an installation or a machine id carries no
//     marker; ownership needs both the tags (HasOwnershipTags) and the
//     description naming this installation.
//   - Tags are lossy (slugged, see naming.Slug); the exact machine id
//     lives only in the description.
//   - It depends on neither go-proxmox nor the adapter, so the simulator
//     stays free of both.
package pvemarker
