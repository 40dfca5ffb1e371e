// Package cli is the provider binary's command line: the subcommands
// serve (the default), plan, history, version, help and those the
// registered hypervisors add. It knows no hypervisor: it runs on the
// plugin.Registry its caller builds (cmd/provider, the composition root;
// a plug-in's tests with their own registry).
package cli
