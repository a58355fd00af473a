#!/usr/bin/env bash
# Issue 18, part 1: forks that differ. Starts the local stack in a
# temporary state directory and records a sandbox (--snapshot every)
# whose python context imported random (step 1) and whose node context
# started (step 2). In the original, the next random.random() is V. Then:
# a fork of 4 copies of step 2 gives 4 different random.random() values
# and 4 different Math.random() values (each copy's code contexts were
# reseeded); a restore in place of step 2 gives V again (the recorded
# state exactly, RNG included); a restore in place with --reseed gives
# another value. Passes on values only (no timing). Needs built binaries
# (MOAT_BIN_DIR) and an image whose agent reseeds (MOAT_IMAGE_DIR,
# default <repo>/images/out): 77 (skipped) without an image.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
if [ ! -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ]; then
	echo "SKIP: no guest image in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
state=$(mktemp -d /tmp/moat-reseed-test.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
# Only the ipc door: no TCP port that another stack on this host holds.
export MOAT_GATEWAY_HTTP=${MOAT_GATEWAY_HTTP:-off}
export MOAT_GATEWAY_GRPC=${MOAT_GATEWAY_GRPC:-off}
export MOAT_STACK_METRICS=${MOAT_STACK_METRICS:-0}
export MOAT_VMD_TEMPLATES=${MOAT_VMD_TEMPLATES:-off}
# A test stack: where KVM is not usable (no /dev/kvm, or a probe that
# never came up under it), TCG; with KVM, KVM.
export MOAT_VMD_ALLOW_TCG=${MOAT_VMD_ALLOW_TCG:-true}
moat=$bin/moat
work=$(mktemp -d /tmp/moat-reseed-work.XXXXXX)
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() { # check DESC COMMAND...: passes when the command succeeds
	local desc=$1
	shift
	if "$@"; then ok "$desc"; else bad "$desc"; fi
}

cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

if ! bash "$repo/deploy/moat-stack" start; then
	echo "FAIL - the stack did not start"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi

# distinct N VALUE...: the N values are all different and none is empty.
distinct() {
	local n=$1
	shift
	[ $# -eq "$n" ] && [ "$(printf '%s\n' "$@" | grep -c .)" -eq "$n" ] &&
		[ "$(printf '%s\n' "$@" | sort -u | wc -l)" -eq "$n" ]
}

cid=$("$moat" sandbox create --record --snapshot every 2>"$work/err")
check "recorded sandbox ($cid)" [ -n "$cid" ]
[ -n "$cid" ] || { cat "$work/err"; exit 1; }
sid=$("$moat" --json sandbox get "$cid" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
check "it records into a session ($sid)" [ -n "$sid" ]
"$moat" code "$cid" -c 'import random' >/dev/null 2>>"$work/err"
check "step 1: python imported random" [ $? -eq 0 ]
has_node=0
if "$moat" code "$cid" -l node --context js -c 'let k = 1' >/dev/null 2>>"$work/err"; then
	has_node=1
	ok "step 2: a node context started"
else
	"$moat" code "$cid" -c 'k = 1' >/dev/null 2>>"$work/err"
	echo "# no node context, Math.random is not checked: $(tail -n 1 "$work/err")"
fi
check "steps 1 and 2 have snapshots" [ "$("$moat" history "$cid" | grep -c '\[snapshot\]')" -ge 2 ]
v=$("$moat" code "$cid" -c 'random.random()' 2>>"$work/err")
check "the original's next random.random() ($v)" [ -n "$v" ]

# Fork: every copy's contexts reseeded.
"$moat" fork "$sid" --step 2 --count 4 >"$work/fork" 2>"$work/err"
rc=$?
check "fork 4 copies of step 2 (rc $rc)" [ $rc -eq 0 -a "$(wc -l <"$work/fork")" -eq 4 ]
[ $rc -eq 0 ] || cat "$work/err"
mapfile -t copies < <(cut -d' ' -f1 "$work/fork")
py=() js=()
for c in "${copies[@]}"; do
	py+=("$("$moat" code "$c" -c 'random.random()' 2>>"$work/err")")
	if [ $has_node -eq 1 ]; then
		js+=("$("$moat" code "$c" -l node --context js -c 'Math.random()' 2>>"$work/err")")
	fi
done
check "4 copies, 4 different random.random() (${py[*]})" distinct 4 "${py[@]}"
check "no copy draws the original's next value" sh -c "! printf '%s\n' ${py[*]} | grep -qx -- '$v'"
if [ $has_node -eq 1 ]; then
	check "4 copies, 4 different Math.random() (${js[*]})" distinct 4 "${js[@]}"
fi
for c in "${copies[@]}"; do
	"$moat" sandbox rm "$c" >/dev/null 2>&1
done

# In place: the recorded state, RNG included.
rid=$("$moat" restore "$cid" --session "$sid" --step 2 2>"$work/err")
rc=$?
check "restore in place of step 2 (rc $rc, $rid)" [ $rc -eq 0 -a "$rid" = "$cid" ]
[ $rc -eq 0 ] || cat "$work/err"
out=$("$moat" code "$cid" -c 'random.random()' 2>>"$work/err")
check "restored in place: random.random() is the recorded next value ($out)" [ "$out" = "$v" ]

# In place with --reseed: new seeds.
rid=$("$moat" restore "$cid" --session "$sid" --step 2 --reseed 2>"$work/err")
rc=$?
check "restore in place of step 2 --reseed (rc $rc, $rid)" [ $rc -eq 0 -a "$rid" = "$cid" ]
[ $rc -eq 0 ] || cat "$work/err"
out=$("$moat" code "$cid" -c 'random.random()' 2>>"$work/err")
check "restored with --reseed: another random.random() ($out)" [ -n "$out" -a "$out" != "$v" ]
"$moat" sandbox rm "$cid" >/dev/null 2>&1

echo "# $passed passed, $failed failed"
if [ $failed -ne 0 ]; then
	tail -n 20 "$work/err" "$state"/logs/vmd.log 2>/dev/null
	exit 1
fi
exit 0
