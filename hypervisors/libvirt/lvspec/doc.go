// Package lvspec is the libvirt plug-in's step vocabulary: the typed
// parameters of the steps that build and tear down a libvirt VM (an
// overlay volume on the golden image, a cloud-init seed volume, a domain
// defined on them), as the libvirt planner puts them in a plan and the
// libvirt-shaped adapters (the go-libvirt adapter and the simulator)
// apply them. It imports only the contract, so a simulator can apply
// the steps without the real adapter.
package lvspec
