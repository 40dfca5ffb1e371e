#!/usr/bin/env bash
# container-test.sh: build the real image and run it under podman (root).
#
# CI cannot pull public base images, so the image is built on a local
# distroless stand-in (deploy/local-base) with the same users and CA
# bundle. Podman runs with runc and, on these machines, needs
# /etc/containers/containers.conf to drop the default ulimits and use the
# cgroupfs manager: that file is written only if absent, or backed up and
# restored afterwards. Every image, container and volume made here is
# removed again on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
[[ $(id -u) == 0 ]] || { echo "container-test.sh: run as root (podman, image mounts)" >&2; exit 1; }

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || [[ ! -s /etc/ssl/certs/ca-certificates.crt ]]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc ca-certificates >/dev/null
fi

conf=/etc/containers/containers.conf
backup=""
run_id="ct-$$"
base="localhost/bigfleet-base:$run_id"
img="localhost/bigfleet-provider:$run_id"
cleanup() {
	podman --runtime runc rmi -f "$img" "$base" >/dev/null 2>&1 || true
	if [[ -n $backup ]]; then
		mv -f "$backup" "$conf"
	elif [[ -f $conf.bigfleet-written ]]; then
		rm -f "$conf" "$conf.bigfleet-written"
	fi
}
trap cleanup EXIT
if [[ -e $conf ]]; then
	backup="$conf.bigfleet-backup.$$"
	cp -p "$conf" "$backup"
else
	mkdir -p "$(dirname "$conf")"
	touch "$conf.bigfleet-written"
fi
cat >"$conf" <<'CONF'
# Written by the bigfleet provider's scripts/container-test.sh for its run.
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
CONF

start=$(date +%s)
make build
bash deploy/local-base/build.sh podman "$base" >/dev/null
podman --runtime runc build -q -f deploy/Dockerfile --target prebuilt --build-arg BASE_IMAGE="$base" -t "$img" . >/dev/null
echo "container-test: built $img ($(podman image inspect -f '{{.Size}}' "$img") bytes) on $base"
(cd deploy && BIGFLEET_IMAGE="$img" go test -tags container -count=1 -timeout 10m -run 'TestImage|TestContainer' -v . )
echo "container-test: $(( $(date +%s) - start ))s"
