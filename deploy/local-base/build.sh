#!/usr/bin/env bash
# build.sh ENGINE TAG: build the local distroless stand-in (see Dockerfile)
# with ENGINE (podman or docker) and tag it TAG. Runs as root (the rootfs
# carries uid 65532's home) and needs Debian's ca-certificates.
set -euo pipefail
engine=${1:?usage: build.sh ENGINE TAG}
tag=${2:?usage: build.sh ENGINE TAG}
here=$(cd "$(dirname "$0")" && pwd)
ca=/etc/ssl/certs/ca-certificates.crt
[[ -s $ca ]] || { echo "build.sh: $ca is missing; apt-get install ca-certificates" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/rootfs
install -d -m 0755 "$root" "$root/etc" "$root/etc/ssl" "$root/etc/ssl/certs" "$root/home" "$root/var" "$root/var/lib"
install -d -m 1777 "$root/tmp"
install -d -m 0700 -o 65532 -g 65532 "$root/home/nonroot"
install -m 0644 "$here/passwd" "$here/group" "$here/nsswitch.conf" "$root/etc/"
install -m 0644 "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
tar --numeric-owner -C "$root" -cf "$tmp/rootfs.tar" .
cp "$here/Dockerfile" "$tmp/"
"$engine" build -t "$tag" "$tmp"
