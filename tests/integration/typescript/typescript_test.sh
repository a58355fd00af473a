#!/usr/bin/env bash
# The TypeScript SDK end to end: installs its npm packages once into the
# hash-keyed cache (tests/integration/npm_setup.sh), generates the
# protobuf code from proto/ (clients/typescript/generate.sh) and compiles
# the SDK with tsc in a temporary directory, starts the local stack
# (deploy/moat-stack) in a temporary state directory with the HTTP door
# and the gRPC door on free ports, and runs sdk.test.mjs under node's own
# test runner (before the stack: stream.test.mjs, the ExecStream path
# against a Gateway of its own, which needs no VM). Exit 77 (skipped) when node or npm is missing or the npm
# install fails (no registry); anything else that fails is a failure.
# Needs built binaries (MOAT_BIN_DIR) and images (MOAT_IMAGE_DIR).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}

command -v node >/dev/null ||
	{ echo "SKIPPED: typescript_sdk (node is not installed: run deploy/install-deps.sh)"; exit 77; }
sdk=$(bash "$here/../npm_setup.sh" "$here/package.json")
case $? in
0) ;;
2 | 3)
	echo "SKIPPED: typescript_sdk (the SDK's npm packages could not be installed: see above)"
	exit 77 ;;
*)
	echo "FAIL - npm_setup of $here/package.json"
	exit 1 ;;
esac

state=$(mktemp -d /tmp/moat-ts-test.XXXXXX)
work=$(mktemp -d /tmp/moat-ts-work.XXXXXX)
cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	# purge also frees the snapshots' RAM copies and unmounts the RAM
	# filesystem (deploy/ramfs.sh) the stack made.
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

# The SDK, built as `npm run build` would, outside the source tree.
mkdir -p "$work/sdk"
cp -r "$repo/clients/typescript/src" "$repo/clients/typescript/package.json" \
	"$repo/clients/typescript/tsconfig.json" "$work/sdk/"
ln -s "$sdk/node_modules" "$work/sdk/node_modules"
if ! MOAT_TS_NODE_MODULES=$sdk/node_modules \
	bash "$repo/clients/typescript/generate.sh" "$work/sdk/gen"; then
	echo "FAIL - generate the protobuf code (see above)"
	exit 1
fi
if ! (cd "$work/sdk" && node node_modules/typescript/bin/tsc -p .); then
	echo "FAIL - the SDK compiles with tsc"
	exit 1
fi
echo "ok - SDK generated and compiled"
# The tests import the SDK as ../dist/src/index.js and its packages
# from its node_modules.
mkdir -p "$work/sdk/test"
cp "$here"/*.test.mjs "$work/sdk/test/"
cd "$work/sdk" || exit 1
# The ExecStream path against a Gateway of the test's own (no VM).
timeout 120 node --test --test-reporter=spec test/stream.test.mjs || { echo "FAIL - stream.test.mjs"; exit 1; }

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
http=$(free_port)
grpc=$(free_port)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
export MOAT_GATEWAY_HTTP=127.0.0.1:$http MOAT_GATEWAY_GRPC=127.0.0.1:$grpc
# The cases call back to back from one address: a rate limit well above
# theirs (the door's default is 50 a second).
export MOAT_GATEWAY_RATE_LIMIT_RPS=1000 MOAT_GATEWAY_RATE_LIMIT_BURST=1000
unset MOAT_API_KEY MOAT_GATEWAY_AUTH
if ! bash "$repo/deploy/moat-stack" start; then
	echo "FAIL - stack starts"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
echo "ok - stack starts (HTTP on $http, gRPC on $grpc)"
MOAT_API_KEY=$(cat "$state/api-key") || { echo "FAIL - the stack made no API key"; exit 1; }
export MOAT_API_KEY MOAT_URL=http://127.0.0.1:$http MOAT_GRPC_URL=http://127.0.0.1:$grpc
timeout 700 node --test --test-reporter=spec test/sdk.test.mjs
rc=$?

left=$("$bin/moat" --json sandbox ls | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("sandboxes", [])))')
if [ "$left" != 0 ]; then
	echo "FAIL - $left sandboxes left after the tests"
	"$bin/moat" sandbox ls
	rc=1
fi
bash "$repo/deploy/moat-stack" stop >/dev/null
if grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$state"/logs/*.log; then
	echo "FAIL - sanitizer report in a service log"
	rc=1
fi
exit $rc
