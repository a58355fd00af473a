#!/usr/bin/env bash
# Starts the local stack in a temporary state directory and drives it
# through the moat CLI as a user would: one-shot runs in python and bash,
# exit codes and streams, sandbox lifecycle, files both ways, recording
# (steps with exit codes and the files each created, modified, deleted;
# sessions shown, exported, removed), errors with their exit codes, a
# clean stop that leaves sandboxes running for the next vmd, and a purge
# that leaves no VMM process behind.
# Needs built binaries (MOAT_BIN_DIR) and images (MOAT_IMAGE_DIR, default
# <repo>/images/out).
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
state=$(mktemp -d /tmp/moat-stack-test.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
moat=$bin/moat
work=$(mktemp -d /tmp/moat-stack-work.XXXXXX)
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
	# purge also frees the snapshots' RAM copies and unmounts the RAM
	# filesystem (deploy/ramfs.sh) the stack made.
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

if ! bash "$repo/deploy/moat-stack" start; then
	bad "stack starts"
	tail -n 30 "$state"/logs/*.log
	echo "$passed passed, $((failed)) failed"
	exit 1
fi
ok "stack starts and becomes healthy"
# A relative image dir is made absolute (VMMs start elsewhere); one that
# does not exist is refused at start, naming the setting.
"$bin/moat-vmd" --image-dir nowhere/images --state-dir "$work/vmd-bad" >"$work/vmd-bad.out" 2>&1; rc=$?
check "moat-vmd refuses a missing relative image dir (rc $rc)" sh -c "[ $rc -ne 0 ] && grep -q 'image-dir \"nowhere/images\"' '$work/vmd-bad.out'"

# Whoever can connect to the internal sockets (sessiond, snapd, vmd)
# gets past the gateway's API keys: only the stack's user may.
socks=()
for f in "$state"/*.sock; do [ -e "$f" ] && socks+=("$f"); done
check "the stack's sockets are in its state dir (${#socks[@]} of gateway, survey, sessiond, snapd, vmd)" [ ${#socks[@]} -ge 5 ]
for f in "${socks[@]}"; do
	check "$(basename "$f") is a socket" [ -S "$f" ]
	check "$(basename "$f") has mode 0600 ($(stat -c %a "$f"))" [ "$(stat -c %a "$f")" = 600 ]
done

# shellcheck source=travel_section.sh
. "$(dirname "$0")/travel_section.sh"
if [ "${MOAT_STACK_ONLY:-}" = travel ]; then
	travel_section
	bash "$repo/deploy/moat-stack" stop >/dev/null
	check "travel: no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$state'/logs/*.log"
	echo "$passed passed, $failed failed"
	[ $failed -eq 0 ]
	exit
fi

out=$("$moat" run -c 'print(6*7)' 2>"$work/err"); rc=$?
check "moat run python prints 42 (got '$out', rc $rc)" [ "$out" = 42 -a $rc -eq 0 ]
out=$("$moat" run -l node -c 'console.log(6*7)' 2>"$work/err"); rc=$?
check "moat run -l node prints 42 (got '$out', rc $rc)" [ "$out" = 42 -a $rc -eq 0 ]

out=$("$moat" run -l bash -c 'echo out; echo err >&2; exit 3' 2>"$work/err"); rc=$?
check "bash exit code 3 comes back (rc $rc)" [ $rc -eq 3 ]
check "stdout goes to stdout" [ "$out" = out ]
check "stderr goes to stderr" grep -qx err "$work/err"

printf 'import sys\nprint("from file", file=sys.stderr)\nsys.exit(5)\n' >"$work/prog.py"
"$moat" run "$work/prog.py" >/dev/null 2>"$work/err"; rc=$?
check "moat run FILE runs the file (rc $rc)" [ $rc -eq 5 ]
check "its stderr arrives" grep -q "from file" "$work/err"

out=$(echo 'print(sum(range(10)))' | "$moat" run - 2>/dev/null)
check "moat run - reads code from stdin ($out)" [ "$out" = 45 ]

"$moat" run --timeout 2 -l bash -c 'sleep 30' >/dev/null 2>"$work/err"; rc=$?
check "a timeout ends the run with 124 (rc $rc)" [ $rc -eq 124 ]

id=$("$moat" sandbox create --cpus 1 --memory 256 2>"$work/err")
check "sandbox create prints an id ($id)" [ -n "$id" ]
check "sandbox ls lists it" sh -c "'$moat' sandbox ls | grep -q '$id'"
check "sandbox get --json shows RUNNING" sh -c "'$moat' --json sandbox get '$id' | grep -q RUNNING"

out=$("$moat" exec "$id" -- sh -c 'echo hello > /root/greeting; cat /root/greeting'); rc=$?
check "exec runs in the sandbox ($out)" [ "$out" = hello -a $rc -eq 0 ]
"$moat" exec "$id" -- sh -c 'exit 7'; rc=$?
check "exec returns the program's exit code (rc $rc)" [ $rc -eq 7 ]

head -c 3145728 /dev/urandom >"$work/blob"
check "cp host -> sandbox" "$moat" cp "$work/blob" "$id:/root/dir/blob"
check "cp sandbox -> host" "$moat" cp "$id:/root/dir/blob" "$work/blob.back"
check "binary round trip is identical" cmp -s "$work/blob" "$work/blob.back"
check "ls shows the file" sh -c "'$moat' ls '$id' /root/dir | grep -q blob"
out=$("$moat" exec "$id" -- sha256sum /root/dir/blob | cut -d' ' -f1)
check "hash inside the guest matches" [ "$out" = "$(sha256sum "$work/blob" | cut -d' ' -f1)" ]

"$moat" cp "$id:/root/no-such-file" "$work/x" 2>"$work/err"; rc=$?
check "missing file -> NOT_FOUND exit 69 (rc $rc)" [ $rc -eq 69 ]
check "missing file message names the path" grep -q no-such-file "$work/err"

check "info shows the node and its accel" sh -c "'$moat' info | grep -Eq 'tcg|kvm'"

check "sandbox rm" "$moat" sandbox rm "$id"
"$moat" sandbox get "$id" 2>"$work/err"; rc=$?
check "removed sandbox -> NOT_FOUND (rc $rc)" [ $rc -eq 69 ]
"$moat" exec sb-doesnotexist -- true 2>"$work/err"; rc=$?
check "unknown sandbox -> exit 69 (rc $rc)" [ $rc -eq 69 ]
check "the error says what to do" grep -qi "sandbox" "$work/err"
"$moat" run --cpus 999 -c 'print(1)' 2>"$work/err"; rc=$?
check "999 vcpus -> INVALID_ARGUMENT exit 67 (rc $rc)" [ $rc -eq 67 ]
"$moat" run --memory 1 -c 'print(1)' 2>"$work/err"; rc=$?
check "1 MiB memory -> INVALID_ARGUMENT exit 67 (rc $rc)" [ $rc -eq 67 ]

# Recording: three steps that create, modify and delete files.
rid=$("$moat" sandbox create --record --snapshot none 2>"$work/err")
check "sandbox create --record prints an id ($rid)" [ -n "$rid" ]
sid=$("$moat" --json sandbox get "$rid" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
check "sandbox get shows its session ($sid)" [ -n "$sid" ]
out=$("$moat" exec "$rid" -- sh -c 'echo one > /root/a.txt; echo keep > /root/b.txt; echo made'); rc=$?
check "recorded step 1 runs ($out, rc $rc)" [ "$out" = made -a $rc -eq 0 ]
"$moat" exec "$rid" -- sh -c 'echo two >> /root/a.txt; exit 3' 2>"$work/err"; rc=$?
check "recorded step 2 exits 3 (rc $rc)" [ $rc -eq 3 ]
check "and was recorded (no warning)" sh -c "! grep -q 'not recorded' '$work/err'"
"$moat" exec "$rid" -- rm /root/b.txt; rc=$?
check "recorded step 3 runs (rc $rc)" [ $rc -eq 0 ]
"$moat" history "$rid" >"$work/hist" 2>"$work/err"; rc=$?
check "history lists the steps (rc $rc)" [ $rc -eq 0 ]
check "history shows 3 steps" [ "$(grep -cE '^[0-9]+ +exec ' "$work/hist")" -eq 3 ]
check "history exit codes are 0, 3, 0" [ "$(grep -E '^[0-9]+ +exec ' "$work/hist" | awk '{print $3}' | tr '\n' ' ')" = "0 3 0 " ]
"$moat" session show "$sid" >"$work/show"; rc=$?
check "session show (rc $rc)" [ $rc -eq 0 ]
step_files() { # step_files N: the file lines of step N in $work/show
	awk -v n="$1" '/^[0-9]+ /{cur=$1; next} cur==n && /^      /' "$work/show"
}
step_has() { step_files "$1" | grep -qE "$2"; }
step_lacks() { ! step_files "$1" | grep -q "$2"; }
check "step 1 created a.txt" step_has 1 'created +/root/a.txt'
check "step 1 created b.txt" step_has 1 'created +/root/b.txt'
check "step 2 modified a.txt" step_has 2 'modified +/root/a.txt'
check "step 2 left b.txt alone" step_lacks 2 b.txt
check "step 3 deleted b.txt" step_has 3 'deleted +/root/b.txt'
check "step 3 left a.txt alone" step_lacks 3 a.txt
check "session ls --sandbox lists it" sh -c "'$moat' session ls --sandbox '$rid' | grep -q '$sid'"
"$moat" session export "$sid" >"$work/export.json"; rc=$?
check "session export (rc $rc)" [ $rc -eq 0 ]
valid_json() { python3 -m json.tool "$1" >/dev/null; }
check "export is valid JSON" valid_json "$work/export.json"
three_steps() {
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["steps"]) == 3' "$1"
}
check "export holds the 3 steps" three_steps "$work/export.json"
check "session rm" sh -c "'$moat' session rm '$sid' >/dev/null"
"$moat" session show "$sid" 2>"$work/err"; rc=$?
check "removed session -> NOT_FOUND exit 69 (rc $rc)" [ $rc -eq 69 ]
"$moat" session show ses-0000000000000000 2>"$work/err"; rc=$?
check "unknown session -> exit 69 (rc $rc)" [ $rc -eq 69 ]
"$moat" history "$id" 2>"$work/err"; rc=$?
check "history of a removed / unrecorded sandbox -> exit 69 (rc $rc)" [ $rc -eq 69 ]
check "recorded sandbox rm" sh -c "'$moat' sandbox rm '$rid' >/dev/null"

# Time travel: restore, fork, replay, sessiond down (travel_section.sh).
travel_section

# Guest RAM on the stack's XFS with reflinks (deploy/ramfs.sh) where it
# could be made: the snapshots travel_section took keep their RAM there.
if bash "$repo/deploy/ramfs.sh" check "$state/ram" 2>/dev/null; then
	check "vmd keeps guest RAM on the reflink filesystem" grep -q "guest RAM in $state/ram: snapshots clone it" "$state/logs/vmd.log"
	nsnap=0
	elsewhere=0
	for l in "$state"/snapshots/*/ram; do
		[ -L "$l" ] || continue
		nsnap=$((nsnap + 1))
		case "$(readlink "$l")" in
		"$state"/ram/moat-*) ;;
		*) elsewhere=$((elsewhere + 1)) ;;
		esac
	done
	check "snapshots' RAM lives in $state/ram ($nsnap snapshots, $elsewhere elsewhere)" [ $nsnap -gt 0 -a $elsewhere -eq 0 ]
elif [ "$(id -u)" -eq 0 ] && command -v mkfs.xfs >/dev/null; then
	bad "no reflink RAM filesystem although root with xfsprogs (see moat-stack start's output)"
else
	echo "skip - no reflink RAM filesystem (needs root and xfsprogs): guest RAM in /dev/shm"
fi

# Diff and compare: two recorded sandboxes run the same two steps, then
# part at step 3, where B creates a file, modifies one and deletes one.
session_of() { # session_of SANDBOX: its session id
	"$moat" --json sandbox get "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))'
}
dfa=$("$moat" sandbox create --record --snapshot none 2>"$work/err")
dfb=$("$moat" sandbox create --record --snapshot none 2>"$work/err")
check "two recorded sandboxes for diff ($dfa, $dfb)" [ -n "$dfa" -a -n "$dfb" ]
dsa=$(session_of "$dfa"); dsb=$(session_of "$dfb")
check "both have sessions ($dsa, $dsb)" [ -n "$dsa" -a -n "$dsb" ]
for sb in "$dfa" "$dfb"; do
	"$moat" exec "$sb" -- sh -c 'mkdir -p /root/d; echo one > /root/d/mod.txt; echo old > /root/d/del.txt' >/dev/null 2>&1
	"$moat" exec "$sb" -- ls /root/d >/dev/null 2>&1
done
"$moat" exec "$dfa" -- true >/dev/null 2>&1
"$moat" exec "$dfb" -- sh -c 'echo new > /root/d/new.txt; echo two >> /root/d/mod.txt; rm /root/d/del.txt' >/dev/null 2>&1
"$moat" diff "$dsa" "$dsb" --json >"$work/diff.json" 2>"$work/err"; rc=$?
check "moat diff --json (rc $rc)" [ $rc -eq 0 ]
diff_json() { # diff_json PYTHON-EXPR: true when it holds for the diff d
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' "$work/diff.json" "$1"
}
check "first divergent step is 3" diff_json 'int(d["firstDivergentStep"]) == 3'
step3() { diff_json "any(f[\"path\"] == \"$1\" and f[\"changeA\"] == \"\" and f[\"changeB\"] == \"$2\" for f in d[\"steps\"][2][\"files\"])"; }
check "step 3: B created new.txt" step3 /root/d/new.txt created
check "step 3: B modified mod.txt" step3 /root/d/mod.txt modified
check "step 3: B deleted del.txt" step3 /root/d/del.txt deleted
check "net: mod.txt created on both sides, contents differ" diff_json 'any(f["path"] == "/root/d/mod.txt" and f["changeA"] == "created" and f["changeB"] == "created" and f["sha256A"] != f["sha256B"] for f in d["files"])'
check "net: del.txt only on A" diff_json 'any(f["path"] == "/root/d/del.txt" and f["changeA"] == "created" and f["changeB"] == "" for f in d["files"])'
"$moat" diff "$dsa" "$dsb" >"$work/diff.txt" 2>&1
check "human diff names step 3 and the created file" sh -c "grep -q 'first divergent step: 3' '$work/diff.txt' && grep -q '+ created /root/d/new.txt' '$work/diff.txt'"
"$moat" compare "$dsa" "$dsb" --html "$work/x.html" >"$work/cmp.txt" 2>"$work/err"; rc=$?
check "moat compare --html (rc $rc)" [ $rc -eq 0 ]
check "the report names both sessions" sh -c "grep -q '$dsa' '$work/x.html' && grep -q '$dsb' '$work/x.html'"
check "the report has no script" sh -c "! grep -qi '<script' '$work/x.html'"
"$moat" diff "$dsa" ses-0000000000000000 2>"$work/err"; rc=$?
check "diff with an unknown session -> exit 69 naming it (rc $rc)" sh -c "[ $rc -eq 69 ] && grep -q ses-0000000000000000 '$work/err'"
"$moat" compare "$dsa" 2>/dev/null; rc=$?
check "compare of one session -> exit 67 (rc $rc)" [ $rc -eq 67 ]
check "diff sandboxes rm" sh -c "'$moat' sandbox rm '$dfa' '$dfb' >/dev/null"

# A sandbox left running survives a clean stop (issue 15: its VMM runs
# on for the next vmd, which re-adopts it; adopt_test.sh); purge ends it.
id2=$("$moat" sandbox create 2>/dev/null)
check "second sandbox for the stop test ($id2)" [ -n "$id2" ]
bash "$repo/deploy/moat-stack" stop >/dev/null
sleep 0.5
no_vmm_left() { ! pgrep -f "qemu-system[^ ]* .*$state" >/dev/null; }
check "its VMM still runs after stop" sh -c "pgrep -f 'qemu-system[^ ]* .*$state/vms/$id2/' >/dev/null"
check "its state file is there for the next vmd" [ -f "$state/vms/$id2/state" ]

# Under the sanitizer build a service's report lands in its log.
no_sanitizer_reports() {
	! grep -lE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$state"/logs/*.log
}
check "no sanitizer report in any service log" no_sanitizer_reports

"$moat" info 2>"$work/err"; rc=$?
check "gateway down -> UNAVAILABLE exit 78 (rc $rc)" [ $rc -eq 78 ]
check "the message says how to start it" grep -q "moat-stack start" "$work/err"
bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
check "no qemu of this stack remains after purge" no_vmm_left

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
