#!/usr/bin/env bash
# Issue 18, item 2: branches read as paths, through the whole stack (real
# VMs), with the CLI and the HTTP door. Record 3 steps (--snapshot
# every), restore step 1 in place, run one step: it is step 2 of the
# branch; `history` shows step 1 (inherited, marked with the session that
# holds it) and step 2, not the parent's steps 2 and 3; a fork from step
# 2 of the branch has the branch's files; a restore of step 0 of the
# branch is the parent's starting state; `session tree` shows the parent
# with its branch at step 1, and a step past the branch's end is
# NOT_FOUND saying which steps it has. Over HTTP: GET
# /v1/sessions/{id}/steps lists the inherited step with heldBySession,
# GET /v1/sessions/{id}/tree the same tree, and Fork and Diff accept the
# branch's steps. 77 (skipped) without a guest image or curl.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
if [ ! -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ]; then
	echo "SKIP: no guest image in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
state=$(mktemp -d /tmp/moat-branches-test.XXXXXX)
work=$(mktemp -d /tmp/moat-branches-work.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
# The HTTP door on an address of its own (MOAT_BRANCHES_HTTP, or a free
# port of 127.0.0.1).
if [ -n "${MOAT_BRANCHES_HTTP:-}" ]; then
	export MOAT_GATEWAY_HTTP=$MOAT_BRANCHES_HTTP
else
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	export MOAT_GATEWAY_HTTP=127.0.0.1:$port
fi
export MOAT_GATEWAY_GRPC=off
# A host whose /dev/kvm is there but unusable runs guests under TCG (the
# test's guests run nothing untrusted).
export MOAT_VMD_ALLOW_TCG=${MOAT_VMD_ALLOW_TCG:-true}
http=http://$MOAT_GATEWAY_HTTP
moat=$bin/moat
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() {
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT
json_get() { # json_get FILE EXPR: python expression on d = the JSON
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
get() { # get PATH: the HTTP door's reply body (any status)
	curl -sS -H "Authorization: Bearer $(cat "$state/api-key")" "$http$1"
}
rpc() { # rpc METHOD JSON: the reply body (any status)
	curl -sS -H "Authorization: Bearer $(cat "$state/api-key")" \
		-H 'Content-Type: application/json' -d "$2" "$http/v1/rpc/$1"
}

if ! bash "$repo/deploy/moat-stack" start; then
	bad "stack starts"
	tail -n 30 "$state"/logs/*.log
	echo "$passed passed, $failed failed"
	exit 1
fi
ok "stack starts"

sb=$("$moat" sandbox create --record --snapshot every 2>"$work/err")
check "recorded sandbox ($sb)" [ -n "$sb" ]
if [ -z "$sb" ]; then
	cat "$work/err"
	tail -n 20 "$state"/logs/vmd.log
	echo "$passed passed, $failed failed"
	exit 1
fi
parent=$("$moat" --json sandbox get "$sb" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
for i in 1 2 3; do
	"$moat" exec "$sb" -- sh -c "echo $i >/root/f$i" 2>>"$work/err"
done
check "three steps recorded, each with a snapshot" [ "$("$moat" history "$sb" | grep -c '\[snapshot\]')" -eq 3 ]

# Restore step 1 in place, then one step: step 2 of the branch.
rid=$("$moat" restore "$sb" --step 1 2>"$work/err"); rc=$?
check "restore step 1 (rc $rc, $rid)" [ $rc -eq 0 -a -n "$rid" ]
branch=$("$moat" --json sandbox get "$rid" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
check "it records into a branch ($branch)" [ -n "$branch" -a "$branch" != "$parent" ]
"$moat" exec "$rid" -- sh -c 'echo b >/root/b; exit 4' 2>"$work/err"
"$moat" history "$rid" >"$work/hist"
cat "$work/hist"
check "history: step 1 inherited from the parent" grep -qE "^1 .*\[inherited from $parent\]" "$work/hist"
check "history: step 2 is the branch's own (exit 4)" sh -c "grep -E '^2 ' '$work/hist' | grep -v inherited | grep -q ' 4  '"
check "history: no step 3 (the parent's step 2 and 3 are not on this path)" sh -c "! grep -qE '^3 ' '$work/hist'"
"$moat" session show "$branch" >"$work/show"
check "session show: branched at step 1" grep -q "branched: *from $parent at step 1" "$work/show"
"$moat" restore "$rid" --step 3 --session "$branch" --new 2>"$work/err"; rc=$?
check "step 3 of the branch: NOT_FOUND exit 69 (rc $rc)" [ $rc -eq 69 ]
check "... saying it has steps 1..2" grep -q "steps 1\.\.2" "$work/err"

# Fork from step 2 of the branch: the branch's files, not the parent's.
"$moat" fork "$branch" --step 2 >"$work/fork" 2>"$work/err"; rc=$?
fk=$(cut -d' ' -f1 "$work/fork" | head -1)
check "fork from step 2 of the branch (rc $rc, $fk)" [ $rc -eq 0 -a -n "$fk" ]
out=$("$moat" exec "$fk" -- sh -c 'ls /root | tr "\n" " "' 2>/dev/null)
check "the fork holds f1 and b, not f2 or f3 ($out)" [ "$out" = "b f1 " ]
# Fork from step 1 of the branch: the parent's snapshot of step 1.
"$moat" fork "$branch" --step 1 >"$work/fork1" 2>"$work/err"; rc=$?
fk1=$(cut -d' ' -f1 "$work/fork1" | head -1)
out=$("$moat" exec "$fk1" -- sh -c 'ls /root | tr "\n" " "' 2>/dev/null)
check "fork from inherited step 1 holds only f1 (rc $rc, $out)" [ $rc -eq 0 -a "$out" = "f1 " ]
# Step 0 of the branch's path: the parent's starting state.
z=$("$moat" restore "$rid" --step 0 --session "$branch" --new 2>"$work/err"); rc=$?
"$moat" exec "$z" -- test ! -e /root/f1 >/dev/null 2>&1; out=$?
check "restore step 0 of the branch --new: no f1 yet (rc $rc, test $out)" [ $rc -eq 0 -a "$out" -eq 0 ]

# The tree.
"$moat" session tree "$parent" >"$work/tree"
cat "$work/tree"
check "session tree: the parent first" sh -c "sed -n 2p '$work/tree' | grep -q '^$parent '"
check "session tree: the branch at step 1, 2 steps, last exit 4" grep -qE "^  $branch +step 1 +2 +1 +4$" "$work/tree"
"$moat" session tree "$parent" --json >"$work/tree.json"
check "session tree --json lists the branch's fork too" [ "$(json_get "$work/tree.json" 'len(d["nodes"])')" -ge 4 ]

# HTTP.
get "/v1/sessions/$branch/steps" >"$work/steps.json"
check "GET /v1/sessions/{branch}/steps: step 1 held by the parent" [ "$(json_get "$work/steps.json" '",".join(s["index"] + ":" + s.get("heldBySession", "") for s in d["steps"])')" = "1:$parent,2:" ]
get "/v1/sessions/$parent/tree" >"$work/htree.json"
check "GET /v1/sessions/{parent}/tree: the branch at step 1" [ "$(json_get "$work/htree.json" '[n.get("branchedAt") for n in d["nodes"] if n["sessionId"] == "'"$branch"'"]')" = "['1']" ]
rpc Fork "{\"sessionId\": \"$branch\", \"step\": 2}" >"$work/hfork.json"
hf=$(json_get "$work/hfork.json" 'd["copies"][0]["sandbox"]["id"]' 2>/dev/null)
check "POST /v1/rpc/Fork from step 2 of the branch ($hf)" [ -n "$hf" ]
rpc Diff "{\"sessionA\": \"$parent\", \"sessionB\": \"$branch\"}" >"$work/diff.json"
check "Diff of the parent and its branch parts at step 2" [ "$(json_get "$work/diff.json" 'd.get("firstDivergentStep")')" = 2 ]
rpc GetStep "{\"sessionId\": \"$branch\", \"index\": 5}" >"$work/gs.json"
check "GetStep 5 of the branch: NOT_FOUND naming steps 1..2" grep -q "NOT_FOUND.*1\.\.2\|1\.\.2.*NOT_FOUND" "$work/gs.json"

for i in "$rid" "$fk" "$fk1" "$z" "$hf"; do
	[ -n "$i" ] && "$moat" sandbox rm "$i" >/dev/null 2>&1
done
bash "$repo/deploy/moat-stack" stop >/dev/null
check "no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$state'/logs/*.log"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
