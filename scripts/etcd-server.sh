#!/usr/bin/env bash
# etcd-server.sh: make Debian's etcd (the etcd binary of the etcd-server
# package, 3.4 on bookworm) available at /usr/bin/etcd for `make
# ha-etcd34`, which runs the HA suite against it (ETCDTEST_BINARY) rather
# than the etcd the module embeds. It installs the package when the binary
# is missing (debian-package.sh: root, and the package's own service kept
# from starting), so nothing listens afterwards: the tests start their own
# members on ephemeral ports and kill them. It fails when the binary is missing and cannot be
# installed.
set -euo pipefail
bin=/usr/bin/etcd
if [[ -x $bin ]]; then
	exit 0
fi
bash "$(dirname "$0")/debian-package.sh" etcd-server etcd
if [[ ! -x $bin ]]; then
	echo "etcd-server.sh: installed etcd-server but $bin is still missing" >&2
	exit 1
fi
# (capture first: head under pipefail fails with 141 when etcd is still
# writing its other version lines as head exits)
version=$("$bin" --version)
echo "${version%%$'\n'*}"
