// Package pvespec is the Proxmox plug-in's step vocabulary: the typed
// parameters of the steps that build and tear down a Proxmox VM (a full
// clone of a template, sized after cloning), as the Proxmox planner puts
// them in a plan and the Proxmox-shaped adapters (the go-proxmox adapter
// and the simulator) apply them.
package pvespec
