#!/usr/bin/env bash
# The load test of issue 15: three gateways and two vmds on this machine
# (one moat-sessiond and one moat-snapd; every vmd answers every
# gateway's survey), then tests/bench/load/load.py: CLIENTS concurrent
# clients for SECONDS spread over the three gateways' HTTP doors, mixing
# create, exec, run_code, snapshot, restore and destroy. Leaves
# tests/bench/results/load.json and load.png. Not part of the test suite;
# needs a quiet machine. Usage:
#   tests/bench/load/run.sh [SECONDS] [CLIENTS]     (default 120 100)
# MOAT_LOAD_MAX_SANDBOXES (default 16): the tenant's [tenants]
# max-sandboxes, so creates past it are refused (RESOURCE_EXHAUSTED) and
# the machine is not asked for more VMs than it can hold.
# MOAT_BENCH_LOGS=DIR keeps every service's log there.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
seconds=${1:-120}
clients=${2:-100}
py=/usr/bin/python3
unset MOAT_GATEWAY MOAT_API_KEY MOAT_API_KEY_FILE MOAT_CONFIG

"$py" -c 'import matplotlib' 2>/dev/null ||
	bash "$repo/deploy/install-deps.sh" --bench >/dev/null ||
	echo "load: no matplotlib for $py: the plot is skipped" >&2

root=$(mktemp -d /tmp/moat-load.XXXXXX)
declare -a pids=()
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
spawn() { # spawn LOG COMMAND...
	local log=$1
	shift
	setsid "$@" >>"$log" 2>&1 </dev/null &
	pids+=($!)
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	sleep 2
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	if [ -n "${MOAT_BENCH_LOGS:-}" ]; then
		mkdir -p "$MOAT_BENCH_LOGS"
		cp "$root"/logs/*.log "$MOAT_BENCH_LOGS/" 2>/dev/null
	fi
	for d in "$root"/vmd-*; do [ -d "$d" ] && "$bin/moat-vmd" purge "$d" >/dev/null 2>&1; done
	pkill -KILL -f "$root" 2>/dev/null
	rm -rf "$root" /dev/shm/moat-load-ram."${root##*.}".*
}
trap cleanup EXIT
mkdir -p "$root/logs" "$root/shared"

# Plain tcp on loopback (no TLS: one host), one tenant.
sessiond=tcp://127.0.0.1:$(free_port)
snapd=tcp://127.0.0.1:$(free_port)
export MOAT_TENANTS_MAX_SANDBOXES=${MOAT_LOAD_MAX_SANDBOXES:-16}
# A load test, not abuse: no rate limits.
export MOAT_GATEWAY_RATE_LIMIT_RPS=0 MOAT_TENANTS_KEY_RPS=0
if ! [ -c /dev/kvm ] || ! [ -w /dev/kvm ]; then
	export MOAT_VMD_ALLOW_TCG=${MOAT_VMD_ALLOW_TCG:-true}
fi
spawn "$root/logs/sessiond.log" "$bin/moat-sessiond" --state-dir "$root/shared" --listen "$sessiond"
spawn "$root/logs/snapd.log" "$bin/moat-snapd" --state-dir "$root/shared" --listen "$snapd"
# The key lives in sessiond, which every gateway asks.
mkdir -p "$root/gw-1"
for _ in $(seq 1 50); do
	key=$("$bin/moat-gateway" keys create --tenant default --state-dir "$root/gw-1" \
		--sessiond "$sessiond" 2>/dev/null) && break
	sleep 0.2
done
[ -n "${key:-}" ] || { echo "load: cannot create the API key in sessiond" >&2; exit 1; }
surveys="" urls=""
for g in 1 2 3; do
	s=tcp://127.0.0.1:$(free_port)
	h=127.0.0.1:$(free_port)
	spawn "$root/logs/gateway-$g.log" "$bin/moat-gateway" --state-dir "$root/gw-$g" \
		--listen "ipc://$root/gw-$g.sock" --survey "$s" --sessiond "$sessiond" \
		--snapd "$snapd" --http "$h" --grpc off
	surveys=${surveys:+$surveys,}$s
	urls=${urls:+$urls,}http://$h
done
nodes="" rams=""
for n in 1 2; do
	ram=$(mktemp -d "/dev/shm/moat-load-ram.${root##*.}.XXXXXX")
	# One snapshot key for both (made by the first), so each restores
	# the other's snapshots.
	spawn "$root/logs/vmd-$n.log" "$bin/moat-vmd" --state-dir "$root/vmd-$n" \
		--node-id "load-$n" --listen "ipc://$root/vmd-$n.sock" --survey "$surveys" \
		--snapd "$snapd" --image-dir "$MOAT_IMAGE_DIR" --ram-dir "$ram" \
		--snapshot-key-file "$root/snapshot.key"
	for _ in $(seq 1 100); do [ -s "$root/snapshot.key" ] && break; sleep 0.1; done
	nodes=${nodes:+$nodes,}$root/vmd-$n
	rams=${rams:+$rams,}$ram
done
# Every gateway sees both nodes.
for g in 1 2 3; do
	ok=0
	for _ in $(seq 1 150); do
		n=$("$bin/moat" --gateway "ipc://$root/gw-$g.sock" --api-key "$key" info --json 2>/dev/null |
			"$py" -c 'import json,sys
try: print(sum(1 for n in json.load(sys.stdin).get("nodes", []) if n.get("available")))
except Exception: print(0)')
		[ "${n:-0}" -ge 2 ] && ok=1 && break
		sleep 0.2
	done
	[ $ok = 1 ] || { echo "load: gateway $g does not see both nodes" >&2; tail -n 20 "$root"/logs/*.log; exit 1; }
done
mkdir -p "$repo/tests/bench/results"
"$py" "$repo/tests/bench/load/load.py" --gateways "$urls" --api-key "$key" \
	--nodes "$nodes" --ram-dirs "$rams" --seconds "$seconds" --clients "$clients" \
	--max-sandboxes "$MOAT_TENANTS_MAX_SANDBOXES" \
	--out "$repo/tests/bench/results/load.json" --plot "$repo/tests/bench/results/load.png"
rv=$?
grep -h "killed by signal\|programmer error" "$root"/logs/*.log
exit $rv
