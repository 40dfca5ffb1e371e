// Command provider is the BigFleet CapacityProvider for libvirt hosts and
// Proxmox clusters. It only wires: flags and subcommands here, logic in
// the packages.
package main
