#!/usr/bin/env bash
# integration.sh: the suites that need real protocol peers, run as root.
#  - a real libvirtd (started by libvirt-up.sh, stopped on exit) for the
#    libvirt adapter and the binary's gRPC lifecycle on real domains;
#  - a real qemu-ga on a host socket behind the Proxmox API simulator.
# It fails loudly if the daemon cannot start; it never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export CI=${CI:-true}   # the integration suites fail rather than skip without their peers

cleanup() { bash scripts/libvirt-down.sh || true; }
trap cleanup EXIT

bash scripts/libvirt-up.sh
set -a
# shellcheck disable=SC1091
. /var/lib/bigfleet-test/env
set +a
# -p 1: the libvirt suites restart libvirtd, so they must not overlap.
go test -race -count=1 -p 1 -tags integration -timeout 40m ./hypervisors/libvirt/... ./hypervisors/proxmox/... ./acceptance/...
