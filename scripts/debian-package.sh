#!/usr/bin/env bash
# debian-package.sh PACKAGE [SERVICE]: install Debian's PACKAGE for the
# tests that run its binaries, without letting its own service start
# (policy-rc.d while installing, then the SERVICE unit disabled where
# systemd runs), so nothing listens afterwards: the tests start their own
# processes on ephemeral ports and stop them. Installing needs root; the
# callers (prometheus.sh, etcd-server.sh) run it only when their binaries
# are missing.
set -euo pipefail
pkg=$1
service=${2:-$1}
if [[ $(id -u) != 0 ]]; then
	echo "debian-package.sh: installing Debian's $pkg package needs root (apt-get install --no-install-recommends $pkg)" >&2
	exit 1
fi
policy=/usr/sbin/policy-rc.d
wrote_policy=""
if [[ ! -e $policy ]]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod 755 "$policy"
	wrote_policy=1
fi
cleanup() { [[ -z $wrote_policy ]] || rm -f "$policy"; }
trap cleanup EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
	systemctl disable --now "$service.service" >/dev/null 2>&1 || true
fi
