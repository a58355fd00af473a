#!/usr/bin/env bash
# Issue 13's benchmark: starts a three-host cluster on this machine (every
# link tls+tcp; tests/integration/cluster/cluster_lib.sh) and a one-host
# stack on ipc:// (deploy/moat-stack) side by side, runs
# moat-bench-cluster against both and leaves tests/bench/results/
# cluster.json. Usage: tests/bench/cluster.sh [CALLS] [STEPS]
# MOAT_BENCH_LOGS=DIR keeps every service's log there (where the time of a
# restore on the other node went: its vmd logs the pull and the check).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
unset MOAT_GATEWAY MOAT_API_KEY MOAT_API_KEY_FILE MOAT_INSECURE
c_root=$(mktemp -d /tmp/moat-bench-cluster.XXXXXX)
stack=$c_root/stack
# shellcheck source=../integration/cluster/cluster_lib.sh
. "$repo/tests/integration/cluster/cluster_lib.sh"
cleanup() {
	c_stop
	if [ -n "${MOAT_BENCH_LOGS:-}" ]; then
		mkdir -p "$MOAT_BENCH_LOGS"
		for l in "$c_root"/*/logs/*.log; do
			[ -f "$l" ] && cp "$l" "$MOAT_BENCH_LOGS/$(basename "$(dirname "$(dirname "$l")")")-$(basename "$l")"
		done
	fi
	MOAT_STATE_DIR=$stack bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$c_root"
}
trap cleanup EXIT
c_start || { echo "bench-cluster: the cluster did not start" >&2; tail -n 20 "$c_root"/*/logs/*.log; exit 1; }
MOAT_STATE_DIR=$stack MOAT_STACK_RAMFS=0 bash "$repo/deploy/moat-stack" start >/dev/null || exit 1
mkdir -p "$repo/tests/bench/results"
p=$c_root/pki/client/alice
MOAT_TLS_CA=$p/ca.pem MOAT_TLS_NAME=gateway \
	MOAT_API_KEY_TLS=${c_client##*--api-key } MOAT_API_KEY_IPC=$(cat "$stack/api-key") \
	"$bin/moat-bench-cluster" "$c_gw_url" "ipc://$stack/gateway.sock" \
	"$repo/tests/bench/results/cluster.json" "${1:-500}" "${2:-4}"
