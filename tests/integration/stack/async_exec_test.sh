#!/usr/bin/env bash
# Issue 15, part 7: long one-shot execs hold no worker. Starts the local
# stack in a temporary state directory, then moat-bench-async-exec
# --check creates 10 sandboxes through the gateway, starts 500 `sleep 30`
# execs over them at once and probes GetSandbox every 100 ms until they
# have all answered. With them, 8 more sandboxes are created recorded
# (snapshots MANUAL) and get 9 `sleep 1` execs each at once: steps run
# one at a time per sandbox, so 72 recorded execs wait at once, more than
# the gateway's 64 RPC workers, while holding none (recording them all
# takes about as long as the sleeps under TCG: a step's fs trace is the
# slow part). Passes when every
# GetSandbox answered OK, every exec answered with exit code 0 (no timing
# decides it; the latencies go to the JSON it writes) and each recorded
# sandbox's session has a step per exec sent to it. 50 execs a sandbox
# stay under the guest agent's 64 running execs (guest/agent/agent.h
# AGENT_EXEC_MAX) and vmd's 256 (services/vm/node.h VMD_EXEC_MAX_RUNNING).
# Needs built binaries (MOAT_BIN_DIR) and images (MOAT_IMAGE_DIR, default
# <repo>/images/out). MOAT_ASYNC_EXECS / _SANDBOXES / _SLEEP /
# _RECORD / _RECORD_EXECS make it smaller for a quick run.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
state=$(mktemp -d /tmp/moat-async-test.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
# Eighteen sandboxes of 1 vCPU on this one node (2 vCPUs here): past the
# default vcpu-overcommit of 4. The test is about workers, not placement.
export MOAT_GATEWAY_VCPU_OVERCOMMIT=${MOAT_GATEWAY_VCPU_OVERCOMMIT:-16}
# 600 calls sent at once with one key: past the per-key rate ([tenants]
# key-rps, 50 a second by default), which is not what this measures.
export MOAT_TENANTS_KEY_RPS=${MOAT_TENANTS_KEY_RPS:-0}
out=${MOAT_ASYNC_OUT:-$state/async_exec.json}

cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state"
}
trap cleanup EXIT

if [ ! -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ]; then
	echo "SKIP: no guest image in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
if ! bash "$repo/deploy/moat-stack" start; then
	echo "FAIL - the stack did not start"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
"$bin/moat-bench-async-exec" "ipc://$state/gateway.sock" \
	"$(cat "$state/api-key")" "$out" --check \
	--sandboxes "${MOAT_ASYNC_SANDBOXES:-10}" \
	--execs "${MOAT_ASYNC_EXECS:-500}" --sleep "${MOAT_ASYNC_SLEEP:-30}" \
	--waits "${MOAT_ASYNC_WAITS:-100}" \
	--record "${MOAT_ASYNC_RECORD:-8}" \
	--record-execs "${MOAT_ASYNC_RECORD_EXECS:-9}" \
	--baseline "${MOAT_ASYNC_BASELINE:-0}"
rv=$?
cat "$out" 2>/dev/null
if [ $rv -ne 0 ]; then
	echo "FAIL - long execs through the gateway (see above)"
	tail -n 20 "$state"/logs/gateway.log "$state"/logs/vmd.log
	exit 1
fi
echo "ok - every exec finished with rc 0, every GetSandbox answered and" \
	"every recorded exec is a step of its sandbox's session"
