#!/usr/bin/env bash
# grpc_stream: Gateway.ExecStream, Attach and unary calls through the gRPC door
# of a whole local stack (deploy/moat-stack start, real VMs) in a
# temporary state directory, with the door on a free 127.0.0.1 port
# (MOAT_GATEWAY_GRPC: the gateway reads [gateway] grpc from the
# environment). stream_test.py runs under /usr/bin/python3 with stubs
# generated from proto/ by grpc_tools.protoc: output streamed event by
# event, a cancelled stream and one past its deadline kill their
# process, RunCode and RestoreStep of a recorded sandbox. Exit 77 (skip)
# without a guest image or without python3-grpcio / python3-grpc-tools.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
py=/usr/bin/python3
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}

if [ ! -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ]; then
	echo "SKIP: no guest image in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
[ -x "$py" ] && "$py" -c 'import grpc, grpc_tools.protoc' 2>/dev/null ||
	{ echo "SKIP - $py has no grpc / grpc_tools: apt-get install python3-grpcio python3-grpc-tools (deploy/install-deps.sh)"; exit 77; }

state=$(mktemp -d /tmp/moat-grpc-stream.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_GATEWAY_GRPC=127.0.0.1:$port
# The stack's HTTP door stays off: this test needs only gRPC, and a
# stack already running here may hold 7780.
export MOAT_GATEWAY_HTTP=off

cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state"
}
trap cleanup EXIT

if ! bash "$repo/deploy/moat-stack" start; then
	echo "FAIL - the stack did not start"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
for _ in $(seq 1 100); do
	grep -q "gRPC on" "$state"/logs/gateway.log 2>/dev/null && break
	sleep 0.1
done
if ! grep -q "gRPC on" "$state"/logs/gateway.log; then
	echo "FAIL - the gateway did not serve gRPC on $MOAT_GATEWAY_GRPC"
	tail -n 20 "$state"/logs/gateway.log
	exit 1
fi

mkdir "$state/stubs"
"$py" -m grpc_tools.protoc -I "$repo/proto" \
	--python_out="$state/stubs" --grpc_python_out="$state/stubs" \
	"$repo"/proto/*.proto ||
	{ echo "FAIL - grpc_tools.protoc could not compile proto/"; exit 1; }

rc=0
MOAT_API_KEY=$(cat "$state/api-key") "$py" "$here/stream_test.py" \
	"$MOAT_GATEWAY_GRPC" "$state/stubs" || rc=1
if [ $rc -ne 0 ]; then
	tail -n 30 "$state"/logs/gateway.log "$state"/logs/vmd.log
else
	echo "all gRPC stream checks passed"
fi
exit $rc
