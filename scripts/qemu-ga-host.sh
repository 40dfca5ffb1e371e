#!/usr/bin/env bash
# Start a host qemu-ga on a unix socket for tests (never as the host's
# agent: dangerous RPCs are blocked). Usage: qemu-ga-host.sh DIR
# Prints the socket path; the pid is in DIR/qga.pid (stop it with
# kill "$(cat DIR/qga.pid)").
set -euo pipefail
dir=${1:?usage: qemu-ga-host.sh DIR}
qga=$(command -v qemu-ga || echo /usr/sbin/qemu-ga)
[ -x "$qga" ] || { echo "qemu-ga not installed (apt-get install qemu-guest-agent)" >&2; exit 1; }
mkdir -p "$dir/state"
block=guest-shutdown,guest-suspend-disk,guest-suspend-ram,guest-suspend-hybrid,guest-set-time,guest-fsfreeze-freeze,guest-fsfreeze-freeze-list,guest-fsfreeze-thaw,guest-set-user-password,guest-set-vcpus,guest-set-memory-blocks,guest-network-get-interfaces
# qemu-ga 7.x calls the flag --block-rpcs (-b); older ones --blacklist.
flag=--block-rpcs
# (capture first: grep -q under pipefail can SIGPIPE qemu-ga and pick the
# wrong flag)
help=$("$qga" --help 2>&1 || true)
grep -q -- --block-rpcs <<<"$help" || flag=--blacklist
"$qga" -m unix-listen -p "$dir/qga.sock" -t "$dir/state" -f "$dir/qga.pid" -l "$dir/qga.log" "$flag=$block" -d
for _ in $(seq 100); do [ -S "$dir/qga.sock" ] && break; sleep 0.02; done
[ -S "$dir/qga.sock" ] || { cat "$dir/qga.log" >&2; exit 1; }
echo "$dir/qga.sock"
