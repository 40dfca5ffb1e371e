#!/usr/bin/env bash
# soak.sh: the churn soak on a real libvirtd (acceptance/soak): the
# provider binary with one zone per transport (unix socket, qemu+tls
# through a relay, qemu+libssh, qemu+ssh), SOAK_WORKERS workers walking real
# tiny guests through Create, Configure, Drain and Delete while a chaos loop
# restarts libvirtd, cuts and freezes the TLS path, kills ssh sessions and
# kill -9s the provider. SOAK_DURATION (default 4m) sets the churn; hours
# work (SOAK_DURATION=2h). It brings up libvirtd and the two sshd daemons
# like integration.sh and stops them on exit, so no process is left behind.
# The summary (cycles, calls by procedure with p50/p99/max, chaos events
# survived, RSS and goroutines) is printed and, with SOAK_REPORT=<file>,
# written there.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export CI=${CI:-true}
SOAK_DURATION=${SOAK_DURATION:-4m}
export SOAK_DURATION
# secs turns 4m, 30m, 2h or 1h30m into seconds.
secs() {
	local d=$1 s=0 n
	while [[ $d =~ ^([0-9]+)(h|m|s)(.*)$ ]]; do
		n=${BASH_REMATCH[1]}
		case ${BASH_REMATCH[2]} in
		h) s=$((s + n * 3600)) ;;
		m) s=$((s + n * 60)) ;;
		s) s=$((s + n)) ;;
		esac
		d=${BASH_REMATCH[3]}
	done
	if [ -n "$d" ] || [ "$s" -lt 60 ]; then
		echo "soak: SOAK_DURATION=$1: want at least a minute, like 4m, 30m or 2h" >&2
		exit 1
	fi
	echo "$s"
}
total=$(secs "$SOAK_DURATION")

cleanup() {
	bash scripts/sshd-down.sh || true
	bash scripts/libvirt-down.sh || true
}
trap cleanup EXIT

bash scripts/libvirt-up.sh
bash scripts/sshd-up.sh
set -a
# shellcheck disable=SC1091
. /var/lib/bigfleet-test/env
set +a
# The test's own deadline: the churn, plus the walk home and the leak check.
go test -tags soak -count=1 -timeout "$((total + 1200))s" -v -run '^TestSoak$' ./acceptance/soak/
