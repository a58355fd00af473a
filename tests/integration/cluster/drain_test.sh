#!/usr/bin/env bash
# Issue 15, part 3: cordon, drain, migrate, on the two-node TLS cluster
# of cluster_lib.sh (its own ports: MOAT_CLUSTER_PORT_BASE 18200):
# - 3 sandboxes on node-a (one recorded with a python context holding a
#   variable, one running a background process, one idle), drained to
#   node-b: same ids, files, the variable, the process alive, the
#   recording goes on in the same session; each reported moved with its
#   pause;
# - no lost writes: a file written through the gateway during the drain
#   (UNAVAILABLE while the sandbox is paused for its move, retried):
#   the moved sandbox holds the last value written;
# - the drained node is cordoned: no new sandbox lands there; `moat node
#   ls` shows it; uncordon: it takes sandboxes again;
# - a tenant outside [gateway] operator-tenants is refused;
# - a drain to a target that refuses (cordoned; then a vmd killed)
#   leaves the sandbox running on node-a, reported failed with why (a
#   move that had paused it resumes it: an exec works right after);
# - the cordon survives a vmd kill -9 and restart (<state>/cordon).
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
export MOAT_CLUSTER_PORT_BASE=${MOAT_CLUSTER_PORT_BASE:-18200}
unset MOAT_GATEWAY MOAT_API_KEY MOAT_API_KEY_FILE MOAT_TLS_CA MOAT_TLS_CERT MOAT_TLS_KEY MOAT_TLS_NAME MOAT_INSECURE
c_root=$(mktemp -d /tmp/moat-drain-test.XXXXXX)
export MOAT_STATE_DIR=$c_root/client
work=$c_root/work
mkdir -p "$work"
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() { # check DESC COMMAND...
	local d=$1
	shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
json_get() { # json_get FILE EXPR: python expression on d = the JSON
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

for t in openssl python3 setsid; do
	command -v "$t" >/dev/null || { echo "SKIP: $t not found"; exit 77; }
done
[ -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ] || { echo "SKIP: no guest image in $MOAT_IMAGE_DIR"; exit 77; }
if ! ip -4 addr show dev lo 2>/dev/null | grep -q '127.0.0.1/8'; then
	echo "SKIP: lo does not carry 127.0.0.0/8"
	exit 77
fi

# shellcheck source=cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"
cleanup() {
	c_stop
	if [ $failed -ne 0 ] || [ -n "${MOAT_CLUSTER_KEEP_LOGS:-}" ]; then
		for f in "$c_root"/h1/logs/*.log "$c_root"/host-*/logs/*.log; do
			[ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }
		done
	fi
	rm -rf "$c_root"
}
trap cleanup EXIT

if ! c_start; then
	bad "the cluster starts (2 nodes available)"
	echo "$passed passed, $failed failed"
	exit 1
fi
ok "the cluster starts: node-a and node-b"
moat() { $c_client "$@"; }
node_of() { # node_of SANDBOX
	moat --json sandbox get "$1" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("nodeId", ""))'
}
node_field() { # node_field NODE FIELD: from `moat node ls --json`
	moat --json node ls 2>/dev/null | python3 -c 'import json,sys
for n in json.load(sys.stdin).get("nodes", []):
    if n["nodeId"] == sys.argv[1]: print(n.get(sys.argv[2], ""))' "$1" "$2"
}
# on_a ARGS...: a new sandbox on node-a: placement takes the node with
# fewest sandboxes, so one that lands on node-b stays as a filler.
on_a() {
	local id n
	for _ in 1 2 3 4 5; do
		id=$(moat sandbox create "$@" 2>>"$work/err") || return 1
		n=$(node_of "$id")
		[ "$n" = node-a ] && { echo "$id"; return 0; }
		sleep 1.5 # the next survey counts it
	done
	return 1
}

# ---- three sandboxes on node-a ----
rid=$(on_a --record --snapshot every)
check "a recorded sandbox on node-a ($rid)" [ -n "$rid" ]
moat code "$rid" -c 'v = "kept"; open("/root/f.txt", "w").write("one")' >/dev/null 2>>"$work/err"
sid=$(moat --json sandbox get "$rid" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
steps0=$(moat history "$rid" 2>/dev/null | grep -c '^ *[0-9]')
pid=$(on_a)
check "a sandbox for a background process on node-a ($pid)" [ -n "$pid" ]
moat exec "$pid" -- sh -c 'sleep 100000 >/dev/null 2>&1 </dev/null & echo $! >/root/bg.pid' >/dev/null 2>>"$work/err"
bg=$(moat exec "$pid" -- cat /root/bg.pid 2>/dev/null)
check "the background process runs (pid $bg)" moat exec "$pid" -- sh -c "kill -0 $bg"
iid=$(on_a)
check "an idle sandbox on node-a ($iid)" [ -n "$iid" ]
moat exec "$iid" -- sh -c 'echo idle >/root/i.txt' >/dev/null 2>>"$work/err"
sleep 1.5

# ---- operator calls only for operator tenants ----
out=$($bin/moat $c_client_tls --api-key "$c_key_b" node cordon node-a 2>&1); rc=$?
check "tenant-b may not cordon: PERMISSION_DENIED naming operator-tenants (rc $rc: $out)" \
	sh -c "[ $rc -ne 0 ] && echo \"\$1\" | grep -q 'operator-tenants'" _ "$out"
out=$(moat node drain node-zz 2>&1); rc=$?
check "drain of an unknown node refused ($out)" sh -c "[ $rc -ne 0 ] && echo \"\$1\" | grep -q 'unknown'" _ "$out"

exp_of() { moat --json sandbox get "$1" 2>/dev/null | python3 -c 'import json,sys; print(int(json.load(sys.stdin).get("expiresUnixMs", 0) or 0))'; }
moat sandbox keepalive "$pid" --timeout 7200 >/dev/null 2>>"$work/err"
exp0=$(exp_of "$pid")

# ---- drain node-a to node-b ----
# writer: 1, 2, ... into $iid:/root/counter.txt until $work/stop exists,
# each value retried until a write of it answers OK (one that failed
# may still have landed: the loop only stops after a success), the last
# written into $work/last (replaced by a rename: a reader never sees it
# empty).
writer() {
	local i=1
	while :; do
		if echo "$i" | moat --timeout 15 cp - "$iid:/root/counter.txt" >/dev/null 2>>"$work/writer.err"; then
			echo "$i" >"$work/last.tmp" && mv -f "$work/last.tmp" "$work/last"
			i=$((i + 1))
			[ -e "$work/stop" ] && break
		else
			echo x >>"$work/writer.fails"
			sleep 0.2
		fi
	done
}
writer &
wpid=$!
for _ in $(seq 1 50); do [ -s "$work/last" ] && break; sleep 0.2; done
before=$(cat "$work/last" 2>/dev/null)
moat node drain node-a --reason "kernel upgrade" >"$work/drain.txt" 2>"$work/err"; rc=$?
during=$(cat "$work/last" 2>/dev/null)
touch "$work/stop"
wait "$wpid"
cat "$work/drain.txt"
last=$(cat "$work/last" 2>/dev/null)
got=$(moat exec "$iid" -- cat /root/counter.txt 2>/dev/null)
echo "writer: $before before the drain, $during at its end, $last last; $(wc -l <"$work/writer.fails" 2>/dev/null || echo 0) failed writes, e.g.: $(grep -m1 -i 'moved' "$work/writer.err")"
check "writes went on during the drain ($before -> $during)" sh -c '[ -n "$1" ] && [ -n "$2" ] && [ "$2" -gt "$1" ]' _ "$before" "$during"
check "no lost writes: the moved sandbox holds the last value written ($got = $last)" [ -n "$last" -a "$got" = "$last" ]
check "drain of node-a (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 ]
for id in "$rid" "$pid" "$iid"; do
	check "$id reported moved with its pause" grep -q "^moved  $id .*node-a -> node-b, paused [0-9]* ms" "$work/drain.txt"
	check "$id now on node-b, same id" [ "$(node_of "$id")" = node-b ]
done
check "its file is there" [ "$(moat exec "$iid" -- cat /root/i.txt 2>/dev/null)" = idle ]
exp1=$(exp_of "$pid")
check "the moved sandbox keeps its expiry ($exp0 -> $exp1, within 5 s)" \
	python3 -c 'import sys; a, b = int(sys.argv[1]), int(sys.argv[2]); sys.exit(not (a > 0 and abs(a - b) <= 5000))' "$exp0" "$exp1"
check "the background process is alive on node-b" moat exec "$pid" -- sh -c "kill -0 $bg"
out=$(moat code "$rid" -c 'v' 2>"$work/err")
check "the python variable is kept ($out)" [ "$out" = "'kept'" ]
check "the recorded file is there" [ "$(moat exec "$rid" -- cat /root/f.txt 2>/dev/null)" = one ]
moat code "$rid" -c 'v = v + "!"' >/dev/null 2>>"$work/err"
sid2=$(moat --json sandbox get "$rid" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
steps1=$(moat history "$rid" 2>/dev/null | grep -c '^ *[0-9]')
check "the moved sandbox's new step snapshots reach snapd (their parent, the drain's, is kept)" \
	sh -c "! grep -q 'not stored in moat-snapd' '$c_root/host-node-b/logs/vmd.log'"
check "the recording goes on in the same session ($sid -> $sid2, steps $steps0 -> $steps1)" \
	[ -n "$sid" -a "$sid" = "$sid2" -a "$steps1" -gt "$steps0" ]

# ---- cordoned: nothing new lands on node-a ----
moat node ls >"$work/ls.txt" 2>&1
cat "$work/ls.txt"
check "node ls shows node-a cordoned with its reason" grep -q "node-a cordoned: kernel upgrade" "$work/ls.txt"
check "node ls shows the protocol version" [ "$(node_field node-a protocolVersion)" = 2 ]
sleep 1.5
landed=""
for _ in 1 2 3; do
	id=$(moat sandbox create 2>"$work/err") || { grep -q cordoned "$work/err" || landed="$landed error:$(head -c 200 "$work/err")"; continue; }
	n=$(node_of "$id")
	[ "$n" = node-a ] && landed="$landed $id"
	moat sandbox rm "$id" >/dev/null 2>&1
done
check "no new sandbox on the cordoned node-a ($landed)" [ -z "$landed" ]
moat node uncordon node-a >/dev/null 2>"$work/err"; rc=$?
sleep 1.5 # the next survey brings the node's new state
check "uncordon node-a (rc $rc)" [ $rc -eq 0 -a "$(node_field node-a cordoned)" != True ]
xid=$(on_a)
check "uncordoned node-a takes a sandbox again ($xid)" [ -n "$xid" ]
moat exec "$xid" -- sh -c 'echo stay >/root/x.txt' >/dev/null 2>>"$work/err"

# ---- a target that refuses leaves the sandbox where it was ----
moat node cordon node-b --reason full >/dev/null 2>"$work/err"
sleep 1.5
moat node drain node-a --to node-b >"$work/d2.txt" 2>"$work/err"; rc=$?
cat "$work/d2.txt"
check "drain to a cordoned target: reported failed, stays on node-a (rc $rc)" \
	grep -q "^failed $xid .*stays on node-a: target node node-b is cordoned" "$work/d2.txt"
check "it still runs on node-a" [ "$(node_of "$xid")" = node-a -a "$(moat exec "$xid" -- cat /root/x.txt 2>/dev/null)" = stay ]
moat node uncordon node-b >/dev/null 2>&1
moat node uncordon node-a >/dev/null 2>&1
sleep 1.5
snaps0=$(moat --json snapshot ls 2>/dev/null | python3 -c 'import json,sys; print(sum(1 for s in json.load(sys.stdin).get("snapshots", []) if s.get("sandboxId") == sys.argv[1]))' "$xid")
c_vmd_kill node-b
moat node drain node-a --to node-b >"$work/d3.txt" 2>"$work/err"; rc=$?
cat "$work/d3.txt" "$work/err"
check "drain to a killed vmd: failed, reported (rc $rc)" \
	sh -c "grep -q '^failed $xid .*stays on node-a' '$work/d3.txt' || grep -q 'node-b' '$work/err'"
check "it still runs on node-a after the refused drain" [ "$(node_of "$xid")" = node-a -a "$(moat exec "$xid" -- cat /root/x.txt 2>/dev/null)" = stay ]
if grep -q "refused the restore" "$work/d3.txt"; then
	check "the paused source was resumed" grep -q "sandbox $xid resumed after its snapshot" "$c_root/host-node-a/logs/vmd.log"
fi
snaps1=$(moat --json snapshot ls 2>/dev/null | python3 -c 'import json,sys; print(sum(1 for s in json.load(sys.stdin).get("snapshots", []) if s.get("sandboxId") == sys.argv[1]))' "$xid")
check "the failed drain's snapshot is deleted ($snaps0 -> $snaps1)" [ "${snaps1:-x}" = "${snaps0:-y}" ]

# ---- the cordon survives a vmd restart (kill -9, as a crash) ----
moat node cordon node-a --reason "after restart" >/dev/null 2>"$work/err"
c_vmd_kill node-a
c_vmd_start node-a "$c_h2"
up=""
for _ in $(seq 1 60); do
	[ "$(node_field node-a available)" = True ] && [ "$(node_field node-a cordonReason)" = "after restart" ] && { up=1; break; }
	sleep 0.5
done
check "restarted node-a is still cordoned (reason kept)" [ -n "$up" ]
out=$(moat sandbox create 2>&1); rc=$?
check "a create on the restarted, cordoned node-a is refused as cordoned (rc $rc)" \
	sh -c "[ $rc -ne 0 ] && echo \"\$1\" | grep -q 'cordon'" _ "$out"
check "its sandbox was adopted and still answers" [ "$(moat exec "$xid" -- cat /root/x.txt 2>/dev/null)" = stay ]

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
