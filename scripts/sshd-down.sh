#!/usr/bin/env bash
# sshd-down.sh: stop the sshd daemons sshd-up.sh started, and every session
# process they forked, by PID; remove the host-key lines it added to
# /root/.ssh/known_hosts.
set -uo pipefail
STATE=${BIGFLEET_TEST_DIR:-/var/lib/bigfleet-test}
S=$STATE/ssh
log() { echo "sshd-down: $*" >&2; }
children() { # direct children of $1
	local p
	for p in /proc/[0-9]*; do
		[ "$(awk '/^PPid:/{print $2}' "$p/status" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"
	done
}
for name in libssh ssh; do
	f=$S/sshd_$name.pid
	[ -f "$f" ] || continue
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null && grep -q sshd "/proc/$pid/comm" 2>/dev/null; then
		kids=$(children "$pid")
		kill "$pid" $kids 2>/dev/null
		log "stopped sshd $name ($pid${kids:+, sessions $kids})"
	fi
	rm -f "$f"
done
[ -f /root/.ssh/known_hosts ] && sed -i '/ bigfleet-test$/d' /root/.ssh/known_hosts
exit 0
