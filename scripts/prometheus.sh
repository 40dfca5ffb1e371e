#!/usr/bin/env bash
# prometheus.sh: make Debian's Prometheus (the prometheus and promtool
# binaries of the Debian package) available to the tests that run it: the
# alert rules' unit tests (promtool test rules, in `make deploy-test`) and
# the HA suite's fail-over check against a real Prometheus scraping real
# replicas (`make ha`). It installs the package when either binary is
# missing (debian-package.sh: root, and the package's own service kept
# from starting), so nothing listens afterwards: the tests start their
# own Prometheus on ephemeral ports and stop it. It fails when the
# binaries are missing and cannot be installed.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
	exit 0
fi
bash "$(dirname "$0")/debian-package.sh" prometheus
command -v promtool >/dev/null && command -v prometheus >/dev/null
