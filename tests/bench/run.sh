#!/usr/bin/env bash
# Runs the benchmarks against a fresh local stack in a temporary state
# directory and leaves JSON in tests/bench/results/. Timings here are
# noisy: compare the ratios measured side by side within one run.
# Usage: tests/bench/run.sh [BOOTS] [CALLS]   (every bench, one after
# the other, on a quiet machine: about 10 minutes; CALLS, default 1000,
# is the exec round trips each way for the gateway's added latency, whose
# spread is tens of ms around a 1 ms goal)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${MOAT_BIN_DIR:-$repo/build/bin}
state=$(mktemp -d /tmp/moat-bench.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
# The bench's own state directory only (MOAT_STATE_DIR is unset later,
# and purging the default one would stop an operator's stack).
trap 'MOAT_STATE_DIR=$state bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1 || :; rm -rf "$state"' EXIT
bash "$repo/deploy/moat-stack" start
MOAT_API_KEY=$(cat "$state/api-key")
export MOAT_API_KEY
mkdir -p "$repo/tests/bench/results"
"$bin/moat-bench-skeleton" "ipc://$state/gateway.sock" "ipc://$state/vmd.sock" \
	"$(cat "$state/run/vmd.pid")" "$repo/tests/bench/results/skeleton.json" "${1:-5}" "${2:-1000}"
"$bin/moat-bench-travel" "ipc://$state/gateway.sock" "$repo/tests/bench/results/travel.json" 5
bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
unset MOAT_API_KEY MOAT_STATE_DIR

# These start their own services.
images=${MOAT_IMAGE_DIR:-$repo/images/out}
"$bin/moat-bench-snapshot" "$images" "$repo/tests/bench/results/snapshot.json"
# Again with guest RAM on an XFS with reflinks (deploy/ramfs.sh; needs
# root and xfsprogs): snapshots clone RAM instead of copying it.
ramdir=$(mktemp -d /tmp/moat-bench-ram.XXXXXX)
if bash "$repo/deploy/ramfs.sh" up "$ramdir" 4G >/dev/null; then
	MOAT_VMD_RAM_DIR=$ramdir "$bin/moat-bench-snapshot" "$images" \
		"$repo/tests/bench/results/snapshot-reflink.json"
	bash "$repo/deploy/ramfs.sh" down "$ramdir"
fi
rmdir "$ramdir"
# The warm VMM pool ([vmd] vmm-pool): template clones with it off and on.
"$bin/moat-bench-pool" "$images" "$repo/tests/bench/results/pool.json"
"$bin/moat-bench-evict" "$images" "$repo/tests/bench/results/evict.json" 10
# Idle sandboxes per host by [vmd] ram-sharing mode (issue 18); the 100
# count takes a while and most of the host's memory in copy mode.
"$bin/moat-bench-density" "$images" "$repo/tests/bench/results/density.json" \
	copy,private 10,30 30
"$bin/moat-bench-images" "$images" "$repo/tests/bench/results/images.json" 5
MOAT_IMAGE_DIR=$images python3 "$repo/tests/bench/cp_dir_bench.py" 5 # adds "cp_dir" to images.json
"$bin/moat-bench-code" "$images" "$repo/tests/bench/results/code.json" 300
"$bin/moat-bench-isolation" "$images" "$repo/tests/bench/results/isolation.json" 3 200
"$bin/moat-bench-http" "$repo/tests/bench/results/http.json" 200 5
"$bin/moat-bench-sessiond" "$repo/tests/bench/results/sessiond.json"
"$bin/moat-bench-snapd" "$repo/tests/bench/results/snapd.json"
# Where create time goes (issue 18): clones vs cold boots through both
# doors, the node's phases, on two stacks side by side (guest RAM on a
# reflink XFS and on tmpfs with spares).
"$bin/moat-bench-create" "$repo/tests/bench/results/create.json" 10
# Every result as PNG charts in results/plots (Debian's matplotlib, so
# /usr/bin/python3; deploy/install-deps.sh --bench installs it).
/usr/bin/python3 "$repo/tests/bench/plot.py" "$repo/tests/bench/results" ||
	echo "run.sh: plot.py skipped some results (above)" >&2
