#!/usr/bin/env bash
# Runs the benchmarks against a fresh local stack in a temporary state
# directory and leaves JSON in tests/bench/results/. Timings here are
# noisy: compare the ratios measured side by side within one run.
# Usage: tests/bench/run.sh [BOOTS] [CALLS]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${MOAT_BIN_DIR:-$repo/build/bin}
state=$(mktemp -d /tmp/moat-bench.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
trap 'bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1; rm -rf "$state"' EXIT
bash "$repo/deploy/moat-stack" start
mkdir -p "$repo/tests/bench/results"
"$bin/moat-bench-skeleton" "ipc://$state/gateway.sock" "ipc://$state/vmd.sock" \
	"$(cat "$state/run/vmd.pid")" "$repo/tests/bench/results/skeleton.json" "${1:-5}" "${2:-200}"
