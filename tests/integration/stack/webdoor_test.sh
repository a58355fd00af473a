#!/usr/bin/env bash
# stack_webdoor (issue 16, part 2): the HTTP door's Connect streaming and
# gRPC-Web against the local stack with real VMs. Starts the stack in a
# temporary state directory with its HTTP door on a free loopback port
# and [gateway] http-cors-origins set, generates protobuf stubs from
# proto/ with grpc_tools.protoc (as tests/integration/grpc does), then
# runs webdoor_test.py under /usr/bin/python3 (plain http.client, no
# gRPC library): ExecStream over connect+json and connect+proto, a
# Connect-Timeout-Ms that kills its command, gRPC-Web unary and
# streaming, wrong keys, a CORS preflight. Exit 77 when there is no
# guest image or no grpc_tools.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
py=/usr/bin/python3
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
state=$(mktemp -d /tmp/moat-webdoor-test.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin

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
"$py" -c 'import grpc_tools.protoc, google.protobuf' 2>/dev/null ||
	{ echo "SKIP - $py has no grpc_tools: apt-get install python3-grpc-tools"; exit 77; }
mkdir "$state/stubs"
"$py" -m grpc_tools.protoc -I "$repo/proto" --python_out="$state/stubs" \
	"$repo"/proto/*.proto ||
	{ echo "FAIL - grpc_tools.protoc could not compile proto/"; exit 1; }

port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_GATEWAY_HTTP=127.0.0.1:$port
export MOAT_GATEWAY_HTTP_CORS_ORIGINS=https://app.example
if ! bash "$repo/deploy/moat-stack" start; then
	echo "FAIL - the stack did not start"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
rc=0
MOAT_API_KEY=$(cat "$state/api-key") "$py" "$here/webdoor_test.py" \
	"127.0.0.1:$port" "$state/stubs" || rc=1
[ $rc -ne 0 ] && tail -n 30 "$state/logs/gateway.log"
[ $rc -eq 0 ] && echo "all web door checks passed"
exit $rc
