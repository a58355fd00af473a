#!/usr/bin/env bash
# stack_record_start (issue 16 follow-up): on a recorded sandbox every
# started command becomes a step when it ends. Starts the local stack
# (real VMs) with its HTTP door on a free loopback port and runs
# record_start_test.py: ExecStart + ExecWait, ExecStream over Connect,
# a pty session (kind shell), steps in the order commands end, a
# sandbox destroyed while its command is followed. Then stops the stack
# with a command still followed: the gateway must stop and log it as not
# recorded. Exit 77 without a guest image.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
if [ ! -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ]; then
	echo "SKIP: no guest image in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
state=$(mktemp -d /tmp/moat-recstart-test.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_GATEWAY_HTTP=127.0.0.1:$port
if ! bash "$repo/deploy/moat-stack" start; then
	echo "FAIL - the stack did not start"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
log=$state/logs/gateway.log
rc=0
MOAT_API_KEY=$(cat "$state/api-key") python3 "$here/record_start_test.py" \
	"127.0.0.1:$port" "$bin/moat" "$log" | tee "$state/out" || rc=1
sb3=$(sed -n 's/^STOP_SANDBOX //p' "$state/out")
# The stop ends the follower within one of its reads; one that hung
# would be killed by moat-stack after its own wait, which it says.
bash "$repo/deploy/moat-stack" stop >"$state/stop" 2>&1
if ! grep -q "killing it" "$state/stop" && [ -n "$sb3" ] &&
	grep -q "$sb3.*not recorded" "$log"; then
	echo "ok - the stack stops with a command followed; not recorded"
else
	echo "FAIL - the stop with a command followed (sandbox $sb3)"
	rc=1
fi
[ $rc -ne 0 ] && tail -n 30 "$log"
exit $rc
