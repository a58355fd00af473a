#!/usr/bin/env bash
# Sandbox lifetimes through the whole stack (issue 15): a 3 s timeout
# destroys the sandbox (GetSandbox NOT_FOUND afterwards) while its
# recorded session stays listed; keepalive extends a sandbox past its
# first expiry; an idle timeout fires only once the calls stop; a timeout
# over [tenants] timeout-max-s is refused naming the limit; a timeout
# survives kill -9 of moat-vmd and a restart (the re-adopted sandbox
# keeps its expiry and still expires); vmd counts each expiry
# (moat_vmd_sandboxes_expired_total). Needs built binaries (MOAT_BIN_DIR)
# and images (MOAT_IMAGE_DIR, default <repo>/images/out).
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
state=$(mktemp -d /tmp/moat-life-stack.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
moat=$bin/moat
work=$(mktemp -d /tmp/moat-life-work.XXXXXX)
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() { # check DESC COMMAND...: passes when the command succeeds
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

# The tenants' lifetimes: a short default, a maximum of 100 s.
cat >"$work/moat.conf" <<'CONF'
[tenants]
timeout-s = 60
timeout-max-s = 100
CONF
export MOAT_CONFIG=$work/moat.conf

if ! bash "$repo/deploy/moat-stack" start >/dev/null; then
	echo "FAIL - stack starts"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
ok "stack starts"

# get_rc ID: the exit code of `moat sandbox get` (69: NOT_FOUND).
get_rc() { "$moat" sandbox get "$1" >/dev/null 2>&1; echo $?; }
# wait_gone ID SECONDS: true once GetSandbox says NOT_FOUND.
wait_gone() {
	local end=$((SECONDS + $2))
	while [ $SECONDS -lt $end ]; do
		[ "$(get_rc "$1")" = 69 ] && return 0
		sleep 0.5
	done
	return 1
}
field() { # field ID KEY: a field of `moat --json sandbox get`
	"$moat" --json sandbox get "$1" 2>&1 | tee -a "$work/fields" | python3 -c "import json,sys; print(json.load(sys.stdin).get('$2', 0))"
}

# Over the maximum: refused, naming the limit and its key.
"$moat" sandbox create --timeout 101 >/dev/null 2>"$work/err"; rc=$?
check "create --timeout 101 refused (rc $rc)" [ $rc -eq 67 ]
check "the refusal names the maximum and its key ($(head -c 200 "$work/err"))" \
	grep -q "maximum of 100 s (\[tenants\] timeout-max-s" "$work/err"

# Start the sandboxes whose clocks run at once.
tid=$("$moat" sandbox create --record --snapshot none --timeout 60 2>"$work/err")
check "recorded sandbox ($tid)" [ -n "$tid" ]
out=$("$moat" exec "$tid" -- sh -c 'echo hi'); rc=$?
check "a recorded step before it expires ($out, rc $rc)" [ "$out" = hi -a $rc -eq 0 ]
"$moat" sandbox keepalive "$tid" --timeout 3 >/dev/null 2>&1; rc=$?
check "its timeout set to 3 s from now (rc $rc)" [ $rc -eq 0 ]
kid=$("$moat" sandbox create --timeout 10 2>"$work/err")
check "sandbox with a 10 s timeout to keep alive ($kid)" [ -n "$kid" ]
"$moat" sandbox keepalive "$kid" --timeout 95 >"$work/keep" 2>&1; rc=$?
check "keepalive --timeout 95 (rc $rc)" [ $rc -eq 0 ]
check "keepalive prints the new expiry" grep -q "^expires: " "$work/keep"
"$moat" sandbox keepalive "$kid" --timeout 500 >/dev/null 2>"$work/err"; rc=$?
check "keepalive over the maximum refused (rc $rc)" [ $rc -eq 67 ]
check "and says so" grep -q "timeout-max-s" "$work/err"
rid=$("$moat" sandbox create --timeout 30 2>"$work/err")
check "sandbox with a 30 s timeout for the restart ($rid)" [ -n "$rid" ]
iid=$("$moat" sandbox create --idle-timeout 5 2>"$work/err")
check "sandbox with a 5 s idle timeout ($iid)" [ -n "$iid" ]
check "it reports its idle timeout" [ "$(field "$iid" idleTimeoutS)" = 5 ]
expires=$(field "$rid" expiresUnixMs)
check "it reports when it expires ($expires)" [ "${expires:-0}" != 0 ]
[ "${expires:-0}" != 0 ] || tail -n 20 "$work/fields"

# Calls keep the idle sandbox alive past its idle timeout.
end=$((SECONDS + 8))
alive=1
while [ $SECONDS -lt $end ]; do
	"$moat" exec "$iid" -- true >/dev/null 2>&1 || alive=0
	sleep 1.5
done
check "8 s of calls every 1.5 s keep the idle sandbox" [ $alive -eq 1 -a "$(get_rc "$iid")" = 0 ]

# The timeout fires.
check "the 3 s sandbox is gone (GetSandbox NOT_FOUND)" wait_gone "$tid" 20
"$moat" session ls --sandbox "$tid" >"$work/ses" 2>&1
check "its session is still listed" grep -q "$tid" "$work/ses"
check "keepalive kept its sandbox past the first expiry" [ "$(get_rc "$kid")" = 0 ]
t0=$SECONDS
check "without calls the idle sandbox goes" wait_gone "$iid" 15
check "... not before its idle timeout ($((SECONDS - t0)) s after the last call)" [ $((SECONDS - t0)) -ge 3 ]

# kill -9 of vmd, then a start: the re-adopted sandbox keeps its expiry.
vmd=$(cat "$state/run/vmd.pid")
kill -KILL "$vmd"
while kill -0 "$vmd" 2>/dev/null; do sleep 0.1; done
if ! bash "$repo/deploy/moat-stack" start >/dev/null; then
	bad "stack starts again after kill -9 of vmd"
	tail -n 30 "$state/logs/vmd.log"
fi
check "after the restart it runs with the same expiry" [ "$(field "$rid" expiresUnixMs)" = "$expires" ]
check "and still expires" wait_gone "$rid" 60
check "the vmd log says why" grep -q "expired: its timeout passed" "$state/logs/vmd.log"
addr=$(awk '$1 == "vmd" { print $2 }' "$state/metrics.ports" 2>/dev/null)
if [ -n "$addr" ]; then
	curl -fsS "http://$addr/metrics" >"$work/metrics" 2>&1
	check "vmd counts the expiry ($(grep expired_total "$work/metrics" | tr '\n' ' '))" \
		grep -qE '^moat_vmd_sandboxes_expired_total\{reason="timeout"\} [1-9]' "$work/metrics"
fi
"$moat" sandbox rm "$kid" >/dev/null 2>&1
check "no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$state'/logs/*.log"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
