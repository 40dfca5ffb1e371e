// Command provider is the BigFleet CapacityProvider for libvirt hosts and
// Proxmox clusters: the composition root. It registers the hypervisors
// this build serves and runs the command line (package cli); nothing
// else.
package main
