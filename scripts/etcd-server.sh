#!/usr/bin/env bash
# etcd-server.sh: make Debian's etcd (the etcd binary of the etcd-server
# package, 3.4 on bookworm) available at /usr/bin/etcd for `make
# ha-etcd34`, which runs the HA suite against it (ETCDTEST_BINARY) rather
# than the etcd the module embeds. It installs the package when the binary
# is missing, which needs root, and keeps the package's own service from
# starting (policy-rc.d while installing, then disabled), so nothing
# listens afterwards: the tests start their own members on ephemeral
# ports and kill them. It fails when the binary is missing and cannot be
# installed.
set -euo pipefail
bin=/usr/bin/etcd
if [[ -x $bin ]]; then
	exit 0
fi
if [[ $(id -u) != 0 ]]; then
	echo "etcd-server.sh: $bin is missing and installing Debian's etcd-server package needs root (apt-get install --no-install-recommends etcd-server)" >&2
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
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
	systemctl disable --now etcd.service >/dev/null 2>&1 || true
fi
if [[ ! -x $bin ]]; then
	echo "etcd-server.sh: installed etcd-server but $bin is still missing" >&2
	exit 1
fi
"$bin" --version | head -1
