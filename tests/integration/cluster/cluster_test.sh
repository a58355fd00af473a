#!/usr/bin/env bash
# Three hosts on this machine (cluster_lib.sh: gateway + sessiond + snapd
# on 127.0.1.1, vmd node-a on 127.0.2.1, vmd node-b on 127.0.3.1), every
# link tls+tcp with certificates from deploy/moat-pki, driven through the
# moat CLI as a user would:
# - sandboxes placed on both nodes; exec, files and code through the
#   gateway;
# - 3 recorded steps on one node, step 2 restored on the other: files by
#   sha256 and a python variable exact, chunks pulled from snapd;
# - a fork of 4 spread over both nodes;
# - kill -9 of a node's vmd: within 5 s its sandboxes list UNAVAILABLE,
#   and its recorded sandbox comes back on the other node (--step latest);
# - refused: a vmd with a certificate of another CA, a vmd answering the
#   survey with another node's id, a vmd certificate calling sessiond, a
#   link without a certificate, plain tcp:// off loopback, a client
#   without an API key;
# - tenant B's ids asked for tenant A's objects directly at vmd, sessiond
#   and snapd with a gateway certificate: NOT_FOUND (cluster_probe).
# Traffic goes only to 127.0.0.0/8.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
# The CLI must not pick up a local stack's settings.
unset MOAT_GATEWAY MOAT_API_KEY MOAT_API_KEY_FILE MOAT_TLS_CA MOAT_TLS_CERT MOAT_TLS_KEY MOAT_TLS_NAME MOAT_INSECURE
c_root=$(mktemp -d /tmp/moat-cluster-test.XXXXXX)
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
			[ -f "$f" ] && { echo "== $f"; tail -n 25 "$f"; }
		done
	fi
	rm -rf "$c_root"
}
trap cleanup EXIT

if ! c_start; then
	bad "the cluster starts (3 hosts, tls+tcp, 2 nodes available)"
	echo "$passed passed, $failed failed"
	exit 1
fi
ok "the cluster starts: gateway, sessiond, snapd on $c_h1; node-a on $c_h2; node-b on $c_h3; every link tls+tcp"
moat() { $c_client "$@"; }
node_of() { # node_of SANDBOX
	moat --json sandbox get "$1" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("nodeId", ""))'
}

# ---- placement, exec, files, code ----
declare -a sbs=()
declare -A on=()
for i in 1 2 3 4; do
	id=$(moat sandbox create 2>"$work/err") && sbs+=("$id")
	n=$(node_of "$id")
	on[$n]=$((${on[$n]:-0} + 1))
done
check "4 sandboxes made (${#sbs[@]})" [ ${#sbs[@]} -eq 4 ]
check "placed on both nodes (node-a ${on[node-a]:-0}, node-b ${on[node-b]:-0})" [ "${on[node-a]:-0}" -ge 1 -a "${on[node-b]:-0}" -ge 1 ]
for id in "${sbs[@]}"; do
	out=$(moat exec "$id" -- sh -c 'echo hi-$(hostname >/dev/null; echo ok)' 2>"$work/err")
	check "exec on $id ($(node_of "$id")) answers ($out)" [ "$out" = hi-ok ]
done
head -c 100000 /dev/urandom >"$work/blob"
moat cp "$work/blob" "${sbs[0]}:/root/blob" 2>"$work/err"
moat cp "${sbs[0]}:/root/blob" "$work/blob.back" 2>>"$work/err"
check "a file goes in and comes back the same" cmp -s "$work/blob" "$work/blob.back"
out=$(moat code "${sbs[1]}" -c 'z = 6 * 7; z' 2>"$work/err")
check "run_code in a persistent context ($out)" [ "$out" = 42 ]
for id in "${sbs[@]}"; do moat sandbox rm "$id" >/dev/null 2>&1; done

# ---- record on one node, restore step 2 on the other ----
rid=$(moat sandbox create --record --snapshot every 2>"$work/err")
src=$(node_of "$rid")
[ "$src" = node-a ] && dst=node-b || dst=node-a
check "a recorded sandbox ($rid on $src)" [ -n "$rid" -a -n "$src" ]
moat code "$rid" -c 'v = "one"; open("/root/f.txt", "w").write("one")' >/dev/null 2>>"$work/err"
moat code "$rid" -c 'v = "two"; open("/root/f.txt", "a").write("two"); open("/root/g.bin", "wb").write(bytes(range(256)) * 64)' >/dev/null 2>>"$work/err"
moat exec "$rid" -- sh -c 'echo three >/root/three.txt' >/dev/null 2>>"$work/err"
check "3 steps recorded, each with a snapshot" [ "$(moat history "$rid" 2>/dev/null | grep -c '\[snapshot\]')" -eq 3 ]
want=$(printf onetwo | sha256sum | cut -d' ' -f1)
wantg=$(python3 -c 'import hashlib; print(hashlib.sha256(bytes(range(256)) * 64).hexdigest())')
moat --json restore "$rid" --step 2 --new --node "$dst" >"$work/r2.json" 2>"$work/err"; rc=$?
check "restore step 2 on $dst (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 ]
nid=$(json_get "$work/r2.json" 'd["sandbox"]["id"]' 2>/dev/null)
check "it landed on $dst ($(json_get "$work/r2.json" 'd["sandbox"].get("nodeId")' 2>/dev/null))" [ "$(json_get "$work/r2.json" 'd["sandbox"].get("nodeId")' 2>/dev/null)" = "$dst" ]
pulled=$(json_get "$work/r2.json" 'int(d["sandbox"].get("pulledBytes", 0))' 2>/dev/null)
check "chunks were pulled from snapd ($pulled bytes)" [ "${pulled:-0}" -gt 0 ]
out=$(moat exec "$nid" -- sh -c 'sha256sum /root/f.txt /root/g.bin | cut -d" " -f1 | tr "\n" " "; test -e /root/three.txt && echo three' 2>"$work/err")
check "files by sha256 as at step 2, step 3's file absent" [ "$out" = "$want $wantg " ]
out=$(moat code "$nid" -c 'v' 2>"$work/err")
check "the python variable is exact ($out)" [ "$out" = "'two'" ]

# ---- fork of 4 spread over both nodes ----
sid=$(moat --json sandbox get "$rid" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
moat --json fork "$sid" --step 3 --count 4 >"$work/fork.json" 2>"$work/err"; rc=$?
check "fork of 4 (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 ]
nodes=$(json_get "$work/fork.json" '" ".join(sorted(set(c["sandbox"]["nodeId"] for c in d["copies"] if c.get("sandbox"))))' 2>/dev/null)
copies=$(json_get "$work/fork.json" 'sum(1 for c in d["copies"] if c.get("sandbox"))' 2>/dev/null)
check "4 copies ($copies)" [ "${copies:-0}" -eq 4 ]
check "spread over both nodes ($nodes)" [ "$nodes" = "node-a node-b" ]
for c in $(json_get "$work/fork.json" '" ".join(c["sandbox"]["id"] for c in d["copies"] if c.get("sandbox"))' 2>/dev/null); do
	moat sandbox rm "$c" >/dev/null 2>&1
done
moat sandbox rm "$nid" >/dev/null 2>&1

# ---- tenant B at the services directly (gateway certificate) ----
if [ -x "$bin/moat-cluster-probe" ]; then
	snap=$(moat --json session show "$sid" 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print([s for s in d.get("steps", []) if s.get("snapshotId")][-1]["snapshotId"])' 2>/dev/null)
	g=$c_root/pki/gateway/gw1
	probe() { "$bin/moat-cluster-probe" --tls-cert "$g/cert.pem" --tls-key "$g/key.pem" --tls-ca "$g/ca.pem" "$@"; }
	vaddr=$c_h2
	[ "$src" = node-b ] && vaddr=$c_h3
	out=$(probe vmd "tls+tcp://$vaddr:$c_vmd_port" "$src" tenant-b "$rid" 2>"$work/err")
	check "vmd: tenant A's sandbox found by A, NOT_FOUND for B ($out)" [ "$out" = "OK NOT_FOUND" ]
	out=$(probe sessiond "$c_sessiond_url" sessiond tenant-b "$sid" 2>"$work/err")
	check "sessiond: tenant A's session found by A, NOT_FOUND for B ($out)" [ "$out" = "OK NOT_FOUND" ]
	out=$(probe snapd "$c_snapd_url" snapd tenant-b "$snap" 2>"$work/err")
	check "snapd: tenant A's snapshot found by A, NOT_FOUND for B ($out)" [ "$out" = "OK NOT_FOUND" ]
else
	bad "moat-cluster-probe is built"
fi

# ---- refusals at the handshake and by rule ----
p=$c_root/pki
# A link without a certificate to a vmd (required peer certificates).
"$bin/moat" --gateway "tls+tcp://$c_h2:$c_vmd_port" --tls-ca "$p/gateway/gw1/ca.pem" --tls-name node-a --api-key x info >/dev/null 2>"$work/err"; rc=$?
check "a link to vmd without a certificate fails at the handshake (rc $rc: $(head -c 200 "$work/err"))" [ $rc -ne 0 -a $rc -ne 76 ]
# A vmd certificate calling sessiond: its intermediate is not trusted there.
v=$p/vmd/node-a
"$bin/moat" --gateway "$c_sessiond_url" --tls-cert "$v/cert.pem" --tls-key "$v/key.pem" --tls-ca "$p/gateway/gw1/ca.pem" --tls-name sessiond info >/dev/null 2>"$work/err"; rc=$?
check "a vmd certificate calling sessiond is refused (rc $rc)" [ $rc -ne 0 -a $rc -ne 76 ]
# The same call with the gateway's certificate reaches sessiond (which
# then does not know the Gateway service): the refusal above is the
# certificate's.
g=$p/gateway/gw1
"$bin/moat" --gateway "$c_sessiond_url" --tls-cert "$g/cert.pem" --tls-key "$g/key.pem" --tls-ca "$g/ca.pem" --tls-name sessiond info >/dev/null 2>"$work/err"; rc=$?
check "a gateway certificate reaches sessiond (rc $rc: UNIMPLEMENTED is 76)" [ $rc -eq 76 ]
# A client without an API key over TLS.
"$bin/moat" $c_client_tls --api-key "" sandbox ls >/dev/null 2>"$work/err"; rc=$?
check "a client without an API key is UNAUTHENTICATED (rc $rc)" [ $rc -eq 80 ]
# Plain tcp:// off loopback: refused before anything is sent.
"$bin/moat" --gateway tcp://192.0.2.1:7700 --api-key x info >/dev/null 2>"$work/err"; rc=$?
check "a plain tcp:// dial off loopback is refused (rc $rc: $(head -c 200 "$work/err"))" [ $rc -ne 0 ] && grep -qi "insecure\|tls" "$work/err"
timeout 10 "$bin/moat-sessiond" --state-dir "$c_root/refuse" --listen tcp://192.0.2.1:7799 >"$work/out" 2>&1; rc=$?
check "a service refuses to listen on plain tcp:// off loopback (rc $rc)" [ $rc -ne 0 ] && grep -qi "insecure" "$work/out"
# A vmd with a certificate from another CA never joins.
bash "$repo/deploy/moat-pki" init "$c_root/pki2" >/dev/null && bash "$repo/deploy/moat-pki" issue "$c_root/pki2" vmd node-c >/dev/null
mkdir -p "$c_root/host-node-c/logs" "$c_ram/node-c"
v2=$c_root/pki2/vmd/node-c
c_spawn vmd-node-c "$c_root/host-node-c/logs/vmd.log" "$bin/moat-vmd" --state-dir "$c_root/host-node-c" --node-id node-c \
	--listen "tls+tcp://127.0.4.1:$c_vmd_port" --survey "$c_survey_url" --snapd "$c_snapd_url" --image-dir "$MOAT_IMAGE_DIR" \
	--ram-dir "$c_ram/node-c" --tls-cert "$v2/cert.pem" --tls-key "$v2/key.pem" --tls-ca "$v2/ca.pem" --tls-peer-ca "$v2/peer-ca.pem"
# A vmd holding node-a's certificate answering as node-b.
mkdir -p "$c_root/host-rogue/logs" "$c_ram/rogue"
url_b=$(moat info --json | python3 -c 'import json,sys; print([n["rpcUrl"] for n in json.load(sys.stdin)["nodes"] if n["nodeId"] == "node-b"][0])')
# shellcheck disable=SC2046
c_spawn vmd-rogue "$c_root/host-rogue/logs/vmd.log" "$bin/moat-vmd" --state-dir "$c_root/host-rogue" --node-id node-b \
	--listen "tls+tcp://127.0.5.1:$c_vmd_port" --survey "$c_survey_url" --snapd "$c_snapd_url" --image-dir "$MOAT_IMAGE_DIR" \
	--ram-dir "$c_ram/rogue" $(c_tls vmd node-a)
sleep 6
moat info --json >"$work/info.json"
check "a vmd certified by another CA is not a node" [ "$(json_get "$work/info.json" 'sum(1 for n in d["nodes"] if n["nodeId"] == "node-c")')" = 0 ]
check "node-b keeps its address ($url_b)" [ "$(json_get "$work/info.json" '[n["rpcUrl"] for n in d["nodes"] if n["nodeId"] == "node-b"][0]')" = "$url_b" ]
check "the gateway logged the refused answer for node-b" grep -q "node-b.*refused\|refused.*node-b" "$c_root/h1/logs/gateway.log"
kill -KILL "${c_pid[vmd-node-c]}" "${c_pid[vmd-rogue]}" 2>/dev/null
unset 'c_pid[vmd-node-c]' 'c_pid[vmd-rogue]'

# ---- node loss ----
lost=$src
[ "$lost" = node-a ] && alive=node-b || alive=node-a
moat sandbox ls --json >/dev/null 2>&1
c_vmd_kill "$lost"
t0=$SECONDS
state=""
while [ $((SECONDS - t0)) -lt 5 ]; do
	state=$(moat --json sandbox ls 2>/dev/null | RID=$rid python3 -c 'import json,sys,os
d = json.load(sys.stdin)
print([s.get("state", "") for s in d.get("sandboxes", []) if s["id"] == os.environ["RID"]][0] if any(s["id"] == os.environ["RID"] for s in d.get("sandboxes", [])) else "missing")' 2>/dev/null)
	[ "$state" = SANDBOX_STATE_UNAVAILABLE ] && break
	sleep 0.5
done
check "within 5 s the lost node's sandbox lists as UNAVAILABLE ($state after $((SECONDS - t0)) s)" [ "$state" = SANDBOX_STATE_UNAVAILABLE ]
moat --json restore "$rid" --step latest --new >"$work/rl.json" 2>"$work/err"; rc=$?
check "the recorded sandbox comes back from its last snapshot (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 ]
bid=$(json_get "$work/rl.json" 'd["sandbox"]["id"]' 2>/dev/null)
check "on $alive" [ "$(json_get "$work/rl.json" 'd["sandbox"].get("nodeId")' 2>/dev/null)" = "$alive" ]
out=$(moat exec "$bid" -- cat /root/three.txt 2>"$work/err")
check "with step 3's file ($out)" [ "$out" = three ]
out=$(moat code "$bid" -c 'v' 2>"$work/err")
check "and its python variable ($out)" [ "$out" = "'two'" ]

c_stop
check "no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$c_root'/h1/logs/*.log '$c_root'/host-*/logs/*.log"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
