#!/usr/bin/env bash
# prometheus.sh: make Debian's Prometheus (the prometheus and promtool
# binaries of the Debian package) available to the tests that run it: the
# alert rules' unit tests (promtool test rules, in `make deploy-test`) and
# the HA suite's fail-over check against a real Prometheus scraping real
# replicas (`make ha`). It installs the package when either binary is
# missing, which needs root, and keeps the package's own service from
# starting (policy-rc.d while installing, then disabled), so nothing
# listens afterwards: the tests start their own Prometheus on ephemeral
# ports and stop it. It fails when the binaries are missing and cannot be
# installed.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
	exit 0
fi
if [[ $(id -u) != 0 ]]; then
	echo "prometheus.sh: promtool/prometheus are missing and installing Debian's prometheus package needs root (apt-get install --no-install-recommends prometheus)" >&2
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
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
	systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
command -v promtool >/dev/null && command -v prometheus >/dev/null
