#!/usr/bin/env bash
# Issue 13, cross-host restore and node loss on one host, real VMs: a
# stack of its own (vmd node-a) plus a second moat-vmd, node-b, with its
# own state and RAM dirs, both pushing to and pulling from the stack's
# moat-snapd, all on ipc:// sockets. A recorded sandbox of three steps on
# node-a; step 2 restored on node-b (--node) has the files of step 2 (by
# sha256) and not step 3's, its chunks pulled from moat-snapd; an
# unknown --node is refused naming the nodes; a fork of 4 lands on both
# nodes; after kill -9 of node-a's vmd its sandboxes list as unavailable
# within 5 s, a call on one fails at once saying how to bring it back,
# and `moat restore SB --step latest --new` brings it back on node-b.
# Also (issue 14) an allowlist sandbox's step restored on the other node
# keeps its allowlist and runs the guest's egress proxy.
# Not for: TLS or several hosts (the coordinator's cluster test).
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
if [ ! -e "$MOAT_IMAGE_DIR/default" ] && [ ! -d "$MOAT_IMAGE_DIR" ]; then
	echo "skip: no guest images in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
state=$(mktemp -d /tmp/moat-cross-test.XXXXXX)
ramb=$(mktemp -d /dev/shm/moat-cross-test-b.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
export MOAT_GATEWAY_HTTP=off MOAT_GATEWAY_GRPC=off MOAT_VMD_TEMPLATES=off MOAT_STACK_RAMFS=0
export MOAT_VMD_NODE_ID=node-a
# node-b's vmd is started here, not by moat-stack: without usable KVM it
# needs allow-tcg too (accel=auto refuses TCG otherwise).
if ! [ -c /dev/kvm ] || ! [ -w /dev/kvm ]; then
	export MOAT_VMD_ALLOW_TCG=${MOAT_VMD_ALLOW_TCG:-true}
fi
moat=$bin/moat
work=$(mktemp -d /tmp/moat-cross-work.XXXXXX)
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() { # check DESC COMMAND...: passes when the command succeeds
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	pkill -KILL -f "$ramb" 2>/dev/null
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	"$bin/moat-vmd" purge "$state/b" >/dev/null 2>&1
	rm -rf "$state" "$work" "$ramb"
}
trap cleanup EXIT
# state_of SANDBOX: "STATE NODE" as `moat sandbox ls` shows it.
state_of() { "$moat" sandbox ls 2>/dev/null | awk -v id="$1" '$1 == id {print $2, $3}'; }
sha() { "$moat" exec "$1" -- sha256sum "$2" 2>/dev/null | cut -d' ' -f1; }

if ! bash "$repo/deploy/moat-stack" start; then
	bad "stack starts"
	tail -n 30 "$state"/logs/*.log
	echo "$passed passed, $failed failed"
	exit 1
fi
mkdir -p "$state/b"
MOAT_VMD_NODE_ID= "$bin/moat-vmd" --node-id node-b --state-dir "$state/b" \
	--listen "ipc://$state/b/vmd.sock" --survey "ipc://$state/survey.sock" \
	--snapd "ipc://$state/snapd.sock" --image-dir "$MOAT_IMAGE_DIR" \
	--ram-dir "$ramb" --templates off \
	--snapshot-key-file "$state/snapshot.key" >"$state/b/vmd.log" 2>&1 &
for _ in $(seq 1 50); do
	[ "$("$moat" info 2>/dev/null | grep -c 'node-[ab]  available')" -eq 2 ] && break
	sleep 0.2
done
check "both nodes are available" [ "$("$moat" info 2>/dev/null | grep -c 'node-[ab]  available')" -eq 2 ]

sb=$("$moat" sandbox create --record --snapshot every 2>"$work/err")
check "recorded sandbox on node-a ($sb)" [ "$(state_of "$sb")" = "running node-a" ]
"$moat" exec "$sb" -- sh -c 'echo one >/root/a.txt' >/dev/null 2>&1
"$moat" exec "$sb" -- sh -c 'head -c 100000 /dev/urandom >/root/b.bin' >/dev/null 2>&1
sum_b=$(sha "$sb" /root/b.bin)
"$moat" exec "$sb" -- sh -c 'echo three >/root/c.txt' >/dev/null 2>&1
ses=$("$moat" sandbox get "$sb" 2>/dev/null | awk '/^session/ {print $2}')
check "three steps recorded in session $ses" [ -n "$ses" ]

# Restore step 2 on node-b: moat-snapd's copy, chunks pulled there.
rid=$("$moat" restore "$sb" --step 2 --new --node node-b 2>"$work/err"); rc=$?
check "restore step 2 on node-b (rc $rc: $(tr '\n' ' ' <"$work/err"))" \
	sh -c "[ $rc -eq 0 ] && grep -q 'on node node-b' '$work/err'"
check "the restored sandbox runs on node-b" [ "$(state_of "$rid")" = "running node-b" ]
check "step 2's file is there, byte for byte" [ "$(sha "$rid" /root/b.bin)" = "$sum_b" ]
check "step 3's file is not" sh -c "! '$moat' exec '$rid' -- test -e /root/c.txt 2>/dev/null"
check "node-b pulled the chunks from moat-snapd" grep -q "pulled from moat-snapd" "$state/b/vmd.log"

"$moat" restore "$sb" --step 2 --new --node node-z >/dev/null 2>"$work/err"; rc=$?
check "an unknown --node is refused naming the nodes (rc $rc)" \
	sh -c "[ $rc -eq 73 ] && grep -q node-a '$work/err' && grep -q node-b '$work/err'"

"$moat" fork "$ses" --step 3 --count 4 >"$work/fork" 2>"$work/err"; rc=$?
check "fork of 4 (rc $rc)" [ $rc -eq 0 -a "$(wc -l <"$work/fork")" -eq 4 ]
check "its copies land on both nodes" sh -c "grep -q 'on node node-a' '$work/err' && grep -q 'on node node-b' '$work/err'"

# Issue 14: an allowlist sandbox's step restored on the other node takes
# the snapshot's policy from snapd's "network" label (sealed), and its
# guest runs the egress proxy there.
asb=$("$moat" sandbox create --record --snapshot every --allow allowed.test 2>"$work/err")
anode=$(state_of "$asb" | cut -d' ' -f2)
other=node-b
[ "$anode" = node-b ] && other=node-a
"$moat" exec "$asb" -- sh -c 'echo egress >/root/e.txt' >/dev/null 2>&1
arid=$("$moat" restore "$asb" --step 1 --new --node "$other" 2>"$work/err"); rc=$?
check "allowlist step restored on $other (rc $rc: $(tr '\n' ' ' <"$work/err"))" \
	sh -c "[ $rc -eq 0 ] && grep -q 'on node $other' '$work/err'"
check "  it has the snapshot's allowlist" \
	sh -c "'$moat' sandbox get '$arid' 2>/dev/null | grep -q 'network: *allowlist (allowed.test)'"
out=$("$moat" exec "$arid" -- python3 -c 'import os, socket
socket.create_connection(("127.0.0.1", 3128), timeout=5); print("open", os.environ.get("http_proxy"))' 2>&1)
check "  its guest runs the egress proxy ($out)" [ "$out" = "open http://127.0.0.1:3128" ]
"$moat" sandbox rm "$asb" "$arid" >/dev/null 2>&1

# Node loss: node-a's vmd killed.
pkill -KILL -f "moat-vmd --state-dir $state --listen"
t0=$(date +%s)
for _ in $(seq 1 50); do
	[ "$(state_of "$sb")" = "unavailable node-a" ] && break
	sleep 0.1
done
t1=$(date +%s)
check "within 5 s node-a's sandbox lists as unavailable ($((t1 - t0)) s)" \
	sh -c "[ '$(state_of "$sb")' = 'unavailable node-a' ] && [ $((t1 - t0)) -le 5 ]"
"$moat" exec "$sb" -- true >/dev/null 2>"$work/err"; rc=$?
check "exec on it: UNAVAILABLE, saying how to bring it back (rc $rc)" \
	sh -c "[ $rc -eq 78 ] && grep -q -- '--step latest --new' '$work/err'"
nid=$("$moat" restore "$sb" --step latest --new 2>"$work/err"); rc=$?
check "restore --step latest --new (rc $rc: $(tr '\n' ' ' <"$work/err"))" [ $rc -eq 0 ]
check "it came back on node-b" [ "$(state_of "$nid")" = "running node-b" ]
check "with step 3's files" "$moat" exec "$nid" -- test -e /root/c.txt
"$moat" sandbox rm "$nid" >/dev/null 2>&1
"$moat" sandbox rm "$rid" >/dev/null 2>&1
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
