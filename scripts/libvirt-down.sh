#!/usr/bin/env bash
# libvirt-down.sh: stop everything libvirt-up.sh started: running domains
# (their QEMU processes), the isolated network, libvirtd and virtlogd, all
# by PID. Definitions, pools and cached artefacts under $BIGFLEET_TEST_DIR
# stay (the next libvirt-up.sh is fast); pass --purge to remove them too.
set -uo pipefail
STATE=${BIGFLEET_TEST_DIR:-/var/lib/bigfleet-test}
URI=qemu:///system
log() { echo "libvirt-down: $*" >&2; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if alive /run/libvirtd.pid; then
	for d in $(virsh -c "$URI" list --name 2>/dev/null); do
		virsh -c "$URI" destroy "$d" >/dev/null 2>&1 && log "destroyed domain $d"
	done
	if [ "${1:-}" = --purge ]; then
		for d in $(virsh -c "$URI" list --all --name 2>/dev/null | grep '^bf-'); do
			virsh -c "$URI" undefine "$d" --managed-save >/dev/null 2>&1
		done
		for p in bigfleet-test-a bigfleet-test-b; do
			virsh -c "$URI" pool-destroy "$p" >/dev/null 2>&1
			virsh -c "$URI" pool-undefine "$p" >/dev/null 2>&1
		done
		virsh -c "$URI" net-undefine bigfleet-isolated >/dev/null 2>&1
	fi
	virsh -c "$URI" net-destroy bigfleet-isolated >/dev/null 2>&1
fi
# QEMU processes that outlived their daemon (e.g. libvirtd killed by a test).
for f in /run/libvirt/qemu/*.pid; do
	[ -f "$f" ] || continue
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null && grep -q qemu "/proc/$pid/comm" 2>/dev/null; then
		kill "$pid" && log "killed qemu $pid"
	fi
done
for f in /run/libvirtd.pid /run/virtlogd.pid; do
	if alive "$f"; then
		pid=$(cat "$f")
		kill "$pid"
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; log "SIGKILLed $pid"; }
		log "stopped $(basename "$f" .pid) ($pid)"
	fi
done
[ "${1:-}" = --purge ] && rm -rf "$STATE"
exit 0
