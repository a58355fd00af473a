#!/usr/bin/env bash
# Two gateways over one cluster (issue 15, part 1): cluster_lib.sh with
# MOAT_CLUSTER_GATEWAYS=2: gw1 on 127.0.1.1, gw2 on 127.0.1.2, one
# sessiond and one snapd, vmd node-a and node-b each answering both
# gateways' surveys ([vmd] survey is a list). Through the moat CLI:
# - both gateways list both nodes;
# - a sandbox created (recorded, snapshot every step) through gw1 is
#   exec'd through gw2 and gw1 in turn: each step lands in the same
#   session, lists only its own file (the gateway that did not run the
#   previous step asks sessiond and traces again), and has a snapshot;
# - gw2 restores step 2 (--new, on the other node) and forks step 3;
# - gw2 shows the session of the sandbox and destroys it;
# - CreateSandbox sent with one request id to both gateways at once, and
#   again later: one sandbox (sessiond's claim); the id reused for another
#   method is refused; a DestroySandbox retried on the other gateway
#   answers as the first did.
# - keys (step 3): the keys made in gw1's local store before it started
#   work on gw2 (imported into sessiond); a key created with
#   `moat-gateway keys create` on gw1's state directory works on gw2 and
#   is listed there; revoked the same way, gw2 refuses it within the 5 s
#   cache bound (polled; the delay is reported, asserted with slack).
# - audit (step 4): both gateways append to sessiond's audit log: gw2's
#   tenants' settings set through gw1's `moat-gateway tenants` are applied
#   by gw2 (max-sandboxes, timeout-s) within 5 s; creates at once through
#   both pass max-sandboxes=1 only once (sessiond's quota reservations);
#   `moat audit` shows the DestroySandbox made through gw1, and gw1's the
#   one made through gw2.
# Traffic goes only to 127.0.0.0/8.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
export MOAT_CLUSTER_PORT_BASE=${MOAT_CLUSTER_PORT_BASE:-18100}
export MOAT_CLUSTER_GATEWAYS=2
unset MOAT_GATEWAY MOAT_API_KEY MOAT_API_KEY_FILE MOAT_TLS_CA MOAT_TLS_CERT MOAT_TLS_KEY MOAT_TLS_NAME MOAT_INSECURE
c_root=$(mktemp -d /tmp/moat-gateways-test.XXXXXX)
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
		for f in "$c_root"/h1/logs/*.log "$c_root"/h1b/logs/*.log "$c_root"/host-*/logs/*.log; do
			[ -f "$f" ] && { echo "== $f"; tail -n 25 "$f"; }
		done
	fi
	rm -rf "$c_root"
}
trap cleanup EXIT

if ! c_start; then
	bad "the cluster starts (2 gateways, 2 nodes available through each)"
	echo "$passed passed, $failed failed"
	exit 1
fi
ok "two gateways ($c_gw_url, $c_gw2_url) each list both nodes"
g1() { $c_client "$@"; }
g2() { $c_client2 "$@"; }
for n in node-a node-b; do
	check "vmd $n answers both gateways' surveys" [ "$(grep -c 'answering surveys from' "$c_root/host-$n/logs/vmd.log")" -eq 2 ]
done

# ---- API keys in sessiond: made through gw1, honoured by gw2 ----
keys1() { "$bin/moat-gateway" keys "$@" --state-dir "$c_root/h1" $(c_tls gateway gw1); }
keys2() { "$bin/moat-gateway" keys "$@" --state-dir "$c_root/h1b" $(c_tls gateway gw2); }
ms() { date +%s%3N; }
check "gw1 imported its local key store into sessiond at start" grep -q "of the local key store are in moat-sessiond" "$c_root/h1/logs/gateway.log"
check "gw2 has no key of its own: it reads sessiond's" [ -z "$(keys2 ls --local 2>&1)" ]
k=$(keys1 create --tenant keys-t 2>"$work/err")
check "a key created through gw1's keys command ($(head -c 200 "$work/err"))" [ -n "$k" ]
kid=$(echo "$k" | cut -d_ -f2)
kg2() { "$bin/moat" $c_client2_tls --api-key "$k" --json sandbox ls >/dev/null 2>"$work/kerr"; }
kg1() { "$bin/moat" $c_client_tls --api-key "$k" --json sandbox ls >/dev/null 2>"$work/kerr"; }
kg2
check "the key works on gw2 ($(head -c 200 "$work/kerr"))" kg2
check "the key works on gw1" kg1
check "gw2's keys command lists it" grep -q "^$kid keys-t .* active$" <(keys2 ls --tenant keys-t 2>&1)
kg2 # cached in gw2 now: the revoke must outlive the cache
out=$(keys1 revoke "$kid" 2>&1)
t0=$(ms)
check "revoked through gw1 ($out)" [ "$out" = "revoked $kid" ]
refused=""
while [ $(($(ms) - t0)) -lt 15000 ]; do
	if ! kg2; then
		refused=$(($(ms) - t0))
		break
	fi
	sleep 0.2
done
echo "# gw2 refused the revoked key after ${refused:-never} ms (contract: 5000)"
within_contract() { [ -n "$refused" ] && [ "$refused" -le 8000 ]; }
check "gw2 refuses the revoked key within 5 s + slack (${refused:-never} ms)" within_contract
check "the refusal says UNAUTHENTICATED ($(head -c 200 "$work/kerr"))" grep -q "revoked API key" "$work/kerr"
sleep 5.2
kg1_refused() { ! kg1; }
check "gw1 refuses it too (after its own 5 s cache)" kg1_refused
check "gw2's keys command shows it revoked" grep -q "^$kid keys-t .* revoked$" <(keys2 ls 2>&1)
out=$(keys2 revoke 000000000000 2>&1)
check "revoking an unknown key says how to list them ($out)" grep -q "keys ls" <<<"$out"

# ---- recorded through gw1, steps through both ----
rid=$(g1 sandbox create --record --snapshot every 2>"$work/err")
check "a recorded sandbox through gw1 ($rid: $(head -c 200 "$work/err"))" [ -n "$rid" ]
src=$(g2 --json sandbox get "$rid" 2>"$work/err" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("nodeId", ""))')
check "gw2 finds it (on $src)" [ -n "$src" ]
sid=$(g2 --json sandbox get "$rid" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
check "gw2 shows its session ($sid, from sessiond)" [ -n "$sid" ]
out=$(g2 exec "$rid" -- sh -c 'echo one >/root/one.txt; echo s1' 2>"$work/err")
check "step 1 through gw2 ($out)" [ "$out" = s1 ]
out=$(g1 exec "$rid" -- sh -c 'echo two >/root/two.txt; echo s2' 2>"$work/err")
check "step 2 through gw1 ($out)" [ "$out" = s2 ]
g2 code "$rid" -c 'v = "three"; open("/root/three.txt", "w").write("3")' >/dev/null 2>"$work/err"; rc=$?
check "step 3 through gw2, python (rc $rc)" [ $rc -eq 0 ]
g1 --json session show "$sid" >"$work/ses.json" 2>"$work/err"
check "one session, 3 steps ($(json_get "$work/ses.json" 'len(d.get("steps", []))' 2>/dev/null))" [ "$(json_get "$work/ses.json" 'len(d.get("steps", []))' 2>/dev/null)" = 3 ]
check "each step has a snapshot" [ "$(json_get "$work/ses.json" 'sum(1 for s in d["steps"] if s.get("snapshotId"))' 2>/dev/null)" = 3 ]
for i in 1 2 3; do
	f=$(echo "one two three" | cut -d' ' -f$i)
	paths=$(json_get "$work/ses.json" "' '.join(sorted(e['path'] for e in d['steps'][$i - 1].get('fsTrace', []) if e['path'].endswith('.txt')))" 2>/dev/null)
	check "step $i lists only its own file ($paths)" [ "$paths" = "/root/$f.txt" -o "$paths" = "root/$f.txt" ]
done

# ---- restore and fork through gw2 ----
[ "$src" = node-a ] && dst=node-b || dst=node-a
g2 --json restore "$rid" --step 2 --new --node "$dst" >"$work/r2.json" 2>"$work/err"; rc=$?
check "gw2 restores step 2 on $dst (rc $rc: $(head -c 300 "$work/err"))" [ $rc -eq 0 ]
nid=$(json_get "$work/r2.json" 'd["sandbox"]["id"]' 2>/dev/null)
out=$(g1 exec "$nid" -- sh -c 'cat /root/one.txt /root/two.txt; test -e /root/three.txt && echo three' 2>"$work/err")
check "the restored sandbox holds steps 1 and 2's files, not step 3's (through gw1)" [ "$out" = "one
two" ]
g2 --json fork "$sid" --step 3 --count 2 >"$work/fork.json" 2>"$work/err"; rc=$?
copies=$(json_get "$work/fork.json" 'sum(1 for c in d["copies"] if c.get("sandbox"))' 2>/dev/null)
check "gw2 forks step 3 twice (rc $rc, $copies copies: $(head -c 300 "$work/err"))" [ "${copies:-0}" = 2 ]
for c in $(json_get "$work/fork.json" '" ".join(c["sandbox"]["id"] for c in d["copies"] if c.get("sandbox"))' 2>/dev/null); do
	out=$(g1 code "$c" -c 'v' 2>"$work/err")
	check "copy $c has the python variable through gw1 ($out)" [ "$out" = "'three'" ]
	g1 sandbox rm "$c" >/dev/null 2>&1
done
g1 sandbox rm "$nid" >/dev/null 2>&1
g2 sandbox rm "$rid" >"$work/out" 2>&1; rc=$?
check "gw2 destroys the sandbox gw1 made (rc $rc)" [ $rc -eq 0 ]
g1 sandbox get "$rid" >/dev/null 2>&1; rc=$?
check "gw1 then finds it gone (rc $rc: NOT_FOUND is 69)" [ $rc -ne 0 ]

# ---- idempotency: one request id, two gateways ----
probe() { # probe GATEWAY_URL RID ARGS...
	local url=$1
	shift
	"$bin/moat-idem-probe" --tls-ca "$c_root/pki/client/alice/ca.pem" --tls-name gateway --api-key "$c_key" "$url" "$@"
}
starts() { case "$1" in "$2"*) return 0 ;; esac; return 1; }
same_sandbox() { starts "$1" sb- && [ "$1" = "$2" ]; }
count() { g1 --json sandbox ls 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("sandboxes", [])))'; }
n0=$(count)
rid1=$(( (RANDOM << 30) + (RANDOM << 15) + RANDOM + 1 ))
probe "$c_gw_url" "$rid1" create >"$work/p1" 2>&1 &
p1=$!
sleep 0.2
probe "$c_gw2_url" "$rid1" create >"$work/p2" 2>&1
wait $p1
a=$(cat "$work/p1")
b=$(cat "$work/p2")
check "CreateSandbox with one request id on both gateways at once: one sandbox ($a / $b)" same_sandbox "$a" "$b"
c=$(probe "$c_gw2_url" "$rid1" create 2>&1)
check "the same request id again on gw2 later: the same sandbox ($c)" [ "$c" = "$a" ]
n1=$(count)
check "the cluster holds one more sandbox, not two ($n0 -> $n1)" [ "$n1" -eq $((n0 + 1)) ]
check "gw2 logged the reply as stored" grep -q "request id already run" "$c_root/h1b/logs/gateway.log"
out=$(probe "$c_gw_url" "$rid1" destroy "$a" 2>&1)
check "the request id reused for another method is refused ($out)" starts "$out" INVALID_ARGUMENT
rid2=$((rid1 + 1))
out=$(probe "$c_gw_url" "$rid2" destroy "$a" 2>&1)
check "DestroySandbox through gw1 ($out)" [ "$out" = OK ]
out=$(probe "$c_gw2_url" "$rid2" destroy "$a" 2>&1)
check "DestroySandbox retried on gw2 with its request id: OK again, not NOT_FOUND ($out)" [ "$out" = OK ]
out=$(probe "$c_gw2_url" $((rid1 + 2)) destroy "$a" 2>&1)
check "a new request id destroying it again: NOT_FOUND ($out)" starts "$out" NOT_FOUND

# ---- tenants' settings in sessiond: set through gw1's command, applied by gw2 ----
tenants1() { "$bin/moat-gateway" tenants "$@" --state-dir "$c_root/h1" $(c_tls gateway gw1); }
tenants2() { "$bin/moat-gateway" tenants "$@" --state-dir "$c_root/h1b" $(c_tls gateway gw2); }
kq=$(keys1 create --tenant quota-t 2>/dev/null)
out=$(tenants1 set quota-t max-sandboxes=1 timeout-s=600 2>&1)
check "tenants set through gw1's command ($out)" [ "$out" = "quota-t max-sandboxes=1 timeout-s=600" ]
out=$(tenants2 show quota-t 2>&1)
check "gw2's command shows it ($out)" [ "$out" = "quota-t max-sandboxes=1 timeout-s=600" ]
out=$(tenants2 set quota-t max-vcpus=lots 2>&1); rc=$?
check "a value that is not a number is refused, naming the keys (rc $rc)" sh -c "[ $rc -ne 0 ] && echo \"\$1\" | grep -q 'max-sandboxes, max-vcpus'" _ "$out"
out=$(tenants2 show nobody 2>&1); rc=$?
check "a tenant without settings: NOT_FOUND saying the file's apply (rc $rc)" sh -c "[ $rc -ne 0 ] && echo \"\$1\" | grep -q \"config file's apply\"" _ "$out"
# Each gateway reads the settings again within 5 s.
sleep 5.5
# Two creates at once, one through each gateway: sessiond's quota
# reservations count both, so exactly one passes.
"$bin/moat" $c_client_tls --api-key "$kq" sandbox create >"$work/q1" 2>"$work/q1err" &
qp1=$!
"$bin/moat" $c_client2_tls --api-key "$kq" sandbox create >"$work/q2" 2>"$work/q2err" &
qp2=$!
wait $qp1; wait $qp2
q1=$(cat "$work/q1"); q2=$(cat "$work/q2")
qa=$(printf '%s\n%s\n' "$q1" "$q2" | grep '^sb-' | head -1)
qn=$(printf '%s\n%s\n' "$q1" "$q2" | grep -c '^sb-')
check "two creates at once through gw1 and gw2: exactly one passes ($q1 / $q2)" [ "$qn" = 1 ]
check "the other is refused: max-sandboxes=1 ($(head -c 300 "$work/q1err" "$work/q2err"))" sh -c 'cat "$1" "$2" | grep -q "max-sandboxes"' _ "$work/q1err" "$work/q2err"
"$bin/moat" $c_client2_tls --api-key "$kq" sandbox create >/dev/null 2>"$work/err"; rc=$?
check "a second is refused by gw2: max-sandboxes=1 from sessiond (rc $rc: $(head -c 300 "$work/err"))" grep -q "max-sandboxes" "$work/err"
# gw1 counts it at once, whether or not its inventory lists it yet:
# quotas are counted across gateways in sessiond (README).
"$bin/moat" $c_client_tls --api-key "$kq" sandbox create >/dev/null 2>"$work/err"; rc=$?
check "and by gw1, without waiting for its survey (rc $rc)" grep -q "max-sandboxes" "$work/err"
# Should both have passed (a failure above), the second is removed too.
for q in $q1 $q2; do
	[ "$q" = "$qa" ] || "$bin/moat" $c_client_tls --api-key "$kq" sandbox rm "$q" >/dev/null 2>&1
done
"$bin/moat" $c_client_tls --api-key "$kq" --json sandbox get "$qa" >"$work/qa.json" 2>&1
left=$(python3 -c 'import json,sys,time; d=json.load(open(sys.argv[1])); print(int((int(d.get("expiresUnixMs", 0)) - time.time() * 1000) / 1000))' "$work/qa.json" 2>/dev/null)
check "its timeout is timeout-s=600 from sessiond (expires in ${left:-?} s)" sh -c "[ \"\${1:-0}\" -gt 500 ] && [ \"\$1\" -le 600 ]" _ "$left"
"$bin/moat" $c_client_tls --api-key "$kq" sandbox rm "$qa" >/dev/null 2>&1
# Destroyed through gw1: sessiond stops counting it at once (its landed
# reservation would count it for 30 s otherwise), so gw2 takes a create
# as soon as its own survey no longer lists it.
qb=""
for _ in $(seq 1 40); do
	qb=$("$bin/moat" $c_client2_tls --api-key "$kq" sandbox create 2>"$work/err") && break
	qb=""
	sleep 0.25
done
check "after the destroy gw2 creates again within 10 s, not after 30 ($qb: $(head -c 200 "$work/err"))" starts "$qb" sb-
[ -n "$qb" ] && "$bin/moat" $c_client_tls --api-key "$kq" sandbox rm "$qb" >/dev/null 2>&1
# A restore into a new sandbox counts the snapshot's own memory, not the
# default 256 MiB: 512 held + 512 > 800 (512 + 256 would pass).
out=$(tenants1 set quota-t max-sandboxes=4 max-memory-mib=800 2>&1)
check "tenants set max-memory-mib=800 ($out)" starts "$out" "quota-t max-"
sleep 5.5
qm=$("$bin/moat" $c_client_tls --api-key "$kq" sandbox create --memory 512 --record --snapshot every 2>"$work/err")
check "a recorded 512 MiB sandbox under max-memory-mib=800 ($qm: $(head -c 200 "$work/err"))" starts "$qm" sb-
out=$("$bin/moat" $c_client_tls --api-key "$kq" exec "$qm" -- echo m1 2>"$work/err")
check "its step 1 ($out)" [ "$out" = m1 ]
"$bin/moat" $c_client2_tls --api-key "$kq" restore "$qm" --step 1 --new >/dev/null 2>"$work/err"; rc=$?
check "a restore of its step into a new sandbox through gw2 is refused: 1024 MiB > 800 (rc $rc: $(head -c 300 "$work/err"))" grep -q "max-memory-mib" "$work/err"
"$bin/moat" $c_client_tls --api-key "$kq" sandbox rm "$qm" >/dev/null 2>&1
out=$(tenants1 rm quota-t 2>&1)
check "tenants rm ($out)" starts "$out" "removed the settings of quota-t"
out=$(tenants2 ls 2>&1)
check "tenants ls no longer lists it ($out)" sh -c "! echo \"\$1\" | grep -q quota-t" _ "$out"

# ---- the audit log in sessiond: each gateway shows the other's calls ----
audited() { # audited CLIENT_FN METHOD SANDBOX: polled 5 s
	local i
	for i in $(seq 1 25); do
		"$1" --json audit --limit 1000 2>/dev/null | python3 -c 'import json,sys
d = json.load(sys.stdin)
es = d.get("entries", d if isinstance(d, list) else [])
sys.exit(0 if any(e.get("method") == sys.argv[1] and e.get("sandboxId") == sys.argv[2] for e in es) else 1)' "$2" "$3" && return 0
		sleep 0.2
	done
	return 1
}
check "gw2's audit shows the DestroySandbox of $nid made through gw1" audited g2 DestroySandbox "$nid"
check "gw1's audit shows the DestroySandbox of $rid made through gw2" audited g1 DestroySandbox "$rid"
check "no audit batch fell back to a gateway's own log" sh -c "! grep -q 'kept in this gateway' '$c_root/h1/logs/gateway.log' '$c_root/h1b/logs/gateway.log'"

c_stop
check "no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$c_root'/h1/logs/*.log '$c_root'/h1b/logs/*.log '$c_root'/host-*/logs/*.log"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
