#!/usr/bin/env bash
# vmd restarts keep sandboxes, through the whole stack (issue 15): a
# recorded sandbox and an idle one run, moat-vmd is killed with SIGKILL,
# `deploy/moat-stack start` starts a new one on the same state dir, and
# the gateway finds the node again: both sandboxes answer with their
# files, the recorded one keeps recording (its history goes on from the
# steps before the kill), and a clean stop + start re-adopts them again.
# Needs built binaries (MOAT_BIN_DIR) and images (MOAT_IMAGE_DIR, default
# <repo>/images/out).
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
state=$(mktemp -d /tmp/moat-adopt-stack.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
moat=$bin/moat
work=$(mktemp -d /tmp/moat-adopt-work.XXXXXX)
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() { # check DESC COMMAND...: passes when the command succeeds
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	if [ $failed -gt 0 ]; then
		# What the services said, for the failure's reason.
		tail -n 40 "$state/logs/gateway.log" "$state/logs/vmd.log"
	fi
	# purge kills the VMMs the stopped vmd left running.
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

if ! bash "$repo/deploy/moat-stack" start >/dev/null; then
	echo "FAIL - stack starts"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
ok "stack starts"

rid=$("$moat" sandbox create --record --snapshot none 2>"$work/err")
check "recorded sandbox ($rid)" [ -n "$rid" ]
iid=$("$moat" sandbox create 2>"$work/err")
check "idle sandbox ($iid)" [ -n "$iid" ]
out=$("$moat" exec "$rid" -- sh -c 'echo one > /root/a.txt; echo made'); rc=$?
check "recorded step 1 ($out, rc $rc)" [ "$out" = made -a $rc -eq 0 ]
"$moat" exec "$iid" -- sh -c 'echo idle > /root/i.txt' >/dev/null
pid_before=$("$moat" --json sandbox get "$rid" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("vmmPid", 0))')

# kill -9 of vmd, then a start: the same VMMs serve on.
vmd=$(cat "$state/run/vmd.pid")
kill -KILL "$vmd"
while kill -0 "$vmd" 2>/dev/null; do sleep 0.1; done
if ! bash "$repo/deploy/moat-stack" start >/dev/null; then
	bad "stack starts again after kill -9 of vmd"
	tail -n 30 "$state/logs/vmd.log"
fi
check "the vmd log says it re-adopted them" grep -q "re-adopted its running VMM" "$state/logs/vmd.log"
get_state() { "$moat" --json sandbox get "$1" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("state",""), d.get("vmmPid",0))'; }
out=$(get_state "$rid")
check "recorded sandbox RUNNING with the same VMM ($out, pid before $pid_before)" sh -c "echo '$out' | grep -qE '^(SANDBOX_STATE_)?RUNNING $pid_before\$'"
out=$("$moat" exec "$iid" -- cat /root/i.txt); rc=$?
check "idle sandbox keeps its file ($out, rc $rc)" [ "$out" = idle -a $rc -eq 0 ]
out=$("$moat" exec "$rid" -- sh -c 'cat /root/a.txt; echo two >> /root/a.txt'); rc=$?
check "recorded step 2 after the restart sees step 1's file ($out, rc $rc)" [ "$out" = one -a $rc -eq 0 ]
"$moat" exec "$rid" -- sh -c 'exit 3' 2>"$work/err"; rc=$?
check "recorded step 3 exits 3 (rc $rc)" [ $rc -eq 3 ]
check "and was recorded (no warning)" sh -c "! grep -q 'not recorded' '$work/err'"
"$moat" history "$rid" >"$work/hist" 2>"$work/err"; rc=$?
check "history after the restart (rc $rc)" [ $rc -eq 0 ]
check "history shows the 3 steps, before and after the restart" [ "$(grep -cE '^[0-9]+ +exec ' "$work/hist")" -eq 3 ]
check "history exit codes are 0, 0, 3" [ "$(grep -E '^[0-9]+ +exec ' "$work/hist" | awk '{print $3}' | tr '\n' ' ')" = "0 0 3 " ]

# A clean stop keeps them too.
bash "$repo/deploy/moat-stack" stop >/dev/null
bash "$repo/deploy/moat-stack" start >/dev/null
out=$("$moat" exec "$rid" -- cat /root/a.txt | tr '\n' ' '); rc=$?
check "after stop + start the file holds both steps ($out)" [ "$out" = "one two " ]
check "no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$state'/logs/*.log"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
