#!/usr/bin/env bash
# proto.sh regenerates the committed Go code for the wire contract
# (api/bigfleet/v1alpha1/provider.pb.go and provider_grpc.pb.go) from
# api/bigfleet/v1alpha1/provider.proto. Entry point: `make proto`.
#
# Pinned toolchain (the generated headers record these, so any other version
# changes the committed bytes):
#   protoc              libprotoc 3.21.12, Debian bookworm package
#                       protobuf-compiler 3.21.12-3+deb12u1
#   protoc-gen-go       google.golang.org/protobuf v1.36.12
#   protoc-gen-go-grpc  google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2
#
# Idempotent: installs protoc from apt only when it is missing, installs the
# plugins into .cache/bin only when the pinned version is not already there,
# and always regenerates; two runs produce byte-identical files.
set -euo pipefail

PROTOC_VERSION="libprotoc 3.21.12"
PROTOC_GEN_GO_VERSION="v1.36.12"
PROTOC_GEN_GO_GRPC_VERSION="v1.6.2"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin="$root/.cache/bin"
mkdir -p "$bin"

if ! command -v protoc >/dev/null 2>&1; then
	echo "proto.sh: installing protobuf-compiler from apt" >&2
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null
fi
got="$(protoc --version)"
if [ "$got" != "$PROTOC_VERSION" ]; then
	echo "proto.sh: want protoc \"$PROTOC_VERSION\" (Debian protobuf-compiler), got \"$got\"" >&2
	exit 1
fi

# install_plugin NAME MODULE@VERSION WANT: go install into .cache/bin unless
# "$bin/NAME --version" already prints WANT.
install_plugin() {
	local name="$1" pkg="$2" want="$3"
	if [ -x "$bin/$name" ] && [ "$("$bin/$name" --version 2>/dev/null)" = "$want" ]; then
		return
	fi
	echo "proto.sh: installing $pkg" >&2
	GOBIN="$bin" GOFLAGS=-mod=mod go install "$pkg"
}
install_plugin protoc-gen-go \
	"google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION" \
	"protoc-gen-go $PROTOC_GEN_GO_VERSION"
install_plugin protoc-gen-go-grpc \
	"google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION" \
	"protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION#v}"

# Paths are relative to api/ so the descriptor registers as
# "bigfleet/v1alpha1/provider.proto", matching the proto package.
protoc \
	--proto_path=api \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
	--go_out=api --go_opt=paths=source_relative \
	--go-grpc_out=api --go-grpc_opt=paths=source_relative \
	api/bigfleet/v1alpha1/provider.proto

echo "proto.sh: generated api/bigfleet/v1alpha1/provider.pb.go and provider_grpc.pb.go" >&2
