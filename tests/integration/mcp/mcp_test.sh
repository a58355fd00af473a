#!/usr/bin/env bash
# MCP end to end: starts the local stack (deploy/moat-stack) in a
# temporary state directory with the HTTP door on a free port, then runs
# mcp_test.mjs, the official MCP TypeScript SDK client, over stdio
# (spawning `moat mcp --allow-dir`) and over Streamable HTTP (the
# gateway's /mcp). The gateway keeps one MCP session, evictable as soon
# as it is idle, so that the client's last step sees an evicted
# session's sandbox destroyed. Fails when the SDK cannot be installed.
# Needs built binaries (MOAT_BIN_DIR), images (MOAT_IMAGE_DIR), node, npm.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}

command -v node >/dev/null ||
	{ echo "FAIL - node is not installed: run deploy/install-deps.sh"; exit 1; }
if ! sdk=$(bash "$here/../npm_setup.sh" "$here/package.json"); then
	echo "FAIL - the MCP TypeScript SDK could not be installed (see above)"
	exit 1
fi

state=$(mktemp -d /tmp/moat-mcp-test.XXXXXX)
work=$(mktemp -d /tmp/moat-mcp-work.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
export MOAT_GATEWAY_HTTP=127.0.0.1:$port
# One /mcp session at a time, evicted by the next initialize once idle
# (the client's sessions never overlap until its eviction step).
export MOAT_GATEWAY_MCP_MAX_SESSIONS=1 MOAT_GATEWAY_MCP_IDLE_S=0
cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	# purge also frees the snapshots' RAM copies and unmounts the RAM
	# filesystem (deploy/ramfs.sh) the stack made.
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

if ! bash "$repo/deploy/moat-stack" start; then
	echo "FAIL - stack starts"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
echo "ok - stack starts (HTTP on $port)"
# The stack's API key: `moat mcp` finds it in the state dir; the HTTP
# client sends it as Authorization: Bearer.
MOAT_API_KEY=$(cat "$state/api-key") || { echo "FAIL - the stack made no API key"; exit 1; }
export MOAT_API_KEY
# A second tenant's key: with keys on, a key the gateway refuses gets no
# MCP session at all (401), so another caller is another tenant.
MOAT_API_KEY_OTHER=$("$bin/moat-gateway" keys create --tenant other \
	--state-dir "$state" 2>/dev/null) ||
	{ echo "FAIL - cannot create a second API key"; exit 1; }
export MOAT_API_KEY_OTHER

# The client resolves the SDK next to the script it runs.
cp "$here/mcp_test.mjs" "$work/"
ln -s "$sdk/node_modules" "$work/node_modules"
mkdir -p "$work/host"
echo "from the host" >"$work/host/in.txt"
MOAT_CLI="$bin/moat" MCP_URL="http://127.0.0.1:$port/mcp" \
	MCP_HOST_DIR="$work/host" node "$work/mcp_test.mjs"
rc=$?

# Every session ended (stdin closed; DELETE /mcp; evicted): their
# sandboxes too.
left=$("$bin/moat" --json sandbox ls | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("sandboxes", [])))')
if [ "$left" = 0 ]; then
	echo "ok - ended sessions leave no sandbox behind"
else
	echo "FAIL - $left sandboxes left after the MCP sessions ended"
	"$bin/moat" sandbox ls
	rc=1
fi

bash "$repo/deploy/moat-stack" stop >/dev/null
if grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$state"/logs/*.log; then
	echo "FAIL - sanitizer report in a service log"
	rc=1
fi
exit $rc
