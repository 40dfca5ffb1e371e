package hypervisors

// TEMPORARY (issue 19 migration): inventory and config still name the
// shape until the plug-in registry replaces it. Deleted before merge.
type Shape string

const (
	ShapeLibvirt Shape = "libvirt"
	ShapeProxmox Shape = "proxmox"
)
