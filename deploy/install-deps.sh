#!/usr/bin/env bash
# Installs the Debian packages moat needs to build, make guest images and
# run its tests; with --bench also what the benchmarks need (matplotlib,
# for tests/bench/load's plot). Idempotent: does nothing when all are
# present. Not for: building (deploy/setup.sh) or starting services (moat-stack).
set -euo pipefail

PKGS=(
	build-essential cmake pkg-config clang-format
	protobuf-c-compiler libprotobuf-c-dev
	libnng-dev liblmdb-dev libinih-dev libcmocka-dev
	libjansson-dev libcurl4-openssl-dev libmicrohttpd-dev libssl-dev
	libnghttp2-dev
	qemu-system-x86 qemu-utils
	mmdebstrap e2fsprogs xfsprogs cpio busybox-static zstd xz-utils kmod
	python3 python3-yaml ca-certificates procps psmisc
	python3-pip python3-setuptools python3-wheel python3-venv
	nodejs npm
	# the TLS tests' throwaway certificates and moat-pki, curl for the
	# HTTPS door, systemd-analyze for the unit files' test
	openssl curl systemd
	# the gRPC door's test (tests/integration/grpc): Debian's gRPC
	# client and its stub generator, for /usr/bin/python3
	python3-grpcio python3-grpc-tools
	# `moat shell`'s test (tests/integration/stack/shell_test.sh) drives
	# it in a terminal multiplexer, and plays the recorded session with
	# asciinema (the format's own player)
	tmux asciinema
	# protoc with plugin support, which runs protoc-gen-es for the
	# TypeScript SDK (clients/typescript/generate.sh); protoc-c cannot
	protobuf-compiler
	# deploy/build-nng.sh: nng's Debian source package, unpacked and
	# built with moat's fix (and TLS through mbedtls, as Debian's)
	dpkg-dev libmbedtls-dev
)
if [ "${1:-}" = --bench ]; then
	PKGS+=(python3-matplotlib)
fi

missing=()
for p in "${PKGS[@]}"; do
	# NodeSource's nodejs carries its own npm (and conflicts with
	# Debian's): an npm on PATH is enough.
	[ "$p" = npm ] && command -v npm >/dev/null && continue
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "install-deps: all ${#PKGS[@]} packages present"
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing packages: ${missing[*]}" >&2
	echo "install-deps: run this script as root (sudo $0)" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
