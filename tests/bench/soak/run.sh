#!/usr/bin/env bash
# The snapshot soak (issue 11): a local stack of its own in a temporary
# state directory, with a 2 GiB snapshot RAM budget, HTTP on a free
# port, and tests/bench/soak/soak.py's agent loops against it for
# SECONDS (default 600); the report goes to tests/bench/results/soak.json.
# Not part of the test suite. Usage: tests/bench/soak/run.sh [SECONDS] [LOOPS]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
bin=${MOAT_BIN_DIR:-$repo/build/bin}
state=$(mktemp -d /tmp/moat-soak.XXXXXX)
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
export MOAT_VMD_SNAPSHOT_RAM_MIB=${MOAT_VMD_SNAPSHOT_RAM_MIB:-2048}
export MOAT_GATEWAY_HTTP=127.0.0.1:$port
# Endurance, not abuse: the HTTP door's rate limit off (rate-limit-rps).
export MOAT_GATEWAY_RATE_LIMIT_RPS=${MOAT_GATEWAY_RATE_LIMIT_RPS:-0}
trap 'MOAT_STATE_DIR=$state bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1 || :; rm -rf "$state"' EXIT
bash "$repo/deploy/moat-stack" start
export MOAT_URL=http://127.0.0.1:$port MOAT_API_KEY=$(cat "$state/api-key")
mkdir -p "$repo/tests/bench/results"
/usr/bin/python3 "$repo/tests/bench/soak/soak.py" "$state" \
	"$repo/tests/bench/results/soak.json" "${1:-600}" "${2:-3}"
grep -h "killed by signal" "$state"/logs/*.log || true
