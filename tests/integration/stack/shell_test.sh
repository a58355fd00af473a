#!/usr/bin/env bash
# Issue 16, item 3: `moat shell` under tmux against the local stack (a
# recorded sandbox, real VM): python3's REPL answers print(6*7) with 42,
# a resize of the tmux window reaches the guest's terminal (python's
# os.get_terminal_size, then `stty size` say 100 columns, 30 rows),
# Ctrl-D ends the REPL, `exit 3` ends the shell and moat's exit code is
# 3. The session is then one step of the recording whose stdout parses
# as asciicast v2 (header, monotonic events, 42 in the output, the resize
# event). Over the HTTP door: ExecResize with rows 0 is INVALID_ARGUMENT
# and on an exec without pty FAILED_PRECONDITION "not a terminal".
# Polls the pane (at most MOAT_SHELL_WAIT_S, default 90 s, per step:
# guests may run under TCG); no timing decides a result. 77 (skipped)
# without tmux or a guest image.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
for t in tmux asciinema script; do
	command -v $t >/dev/null || {
		echo "SKIP: $t is not installed (deploy/install-deps.sh)"
		exit 77
	}
done
if [ ! -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ]; then
	echo "SKIP: no guest image in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
state=$(mktemp -d /tmp/moat-shell-test.XXXXXX)
work=$(mktemp -d /tmp/moat-shell-work.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
# The HTTP door on a port of its own (7780 may be another stack's).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_GATEWAY_HTTP=127.0.0.1:$port
moat=$bin/moat
sock=$work/tmux.sock # private; goes with $work
wait_s=${MOAT_SHELL_WAIT_S:-90}
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() {
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	tmux -S "$sock" kill-server >/dev/null 2>&1
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

pane() { tmux -S "$sock" capture-pane -p -t shell 2>/dev/null; }
# wait_pane REGEX: polls the pane until a line matches.
wait_pane() {
	local end=$((SECONDS + wait_s))
	while [ $SECONDS -lt $end ]; do
		pane | grep -qE "$1" && return 0
		sleep 0.3
	done
	echo "--- pane (waited for /$1/):"
	pane
	return 1
}
keys() { tmux -S "$sock" send-keys -t shell "$@"; }

if ! bash "$repo/deploy/moat-stack" start; then
	bad "stack starts"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
sb=$("$moat" sandbox create --record --snapshot none 2>"$work/err")
check "a recorded sandbox ($sb)" [ -n "$sb" ]

tmux -S "$sock" -f /dev/null new-session -d -s shell -x 80 -y 24 \
	"MOAT_GATEWAY='$MOAT_GATEWAY' MOAT_STATE_DIR='$state' '$moat' shell '$sb'; echo \$? > '$work/rc'; sleep 600"
check "the shell gives a prompt" wait_pane '[#$] *$'
keys python3 Enter
check "python3 starts in it" wait_pane '^>>> *$'
keys 'print(6*7)' Enter
check "print(6*7) shows 42" wait_pane '^42 *$'
tmux -S "$sock" resize-window -t shell -x 100 -y 30
keys 'import os; print(os.get_terminal_size())' Enter
check "the resize reaches python (100 columns, 30 lines)" \
	wait_pane 'columns=100, lines=30'
keys C-d
keys 'stty size' Enter
check "Ctrl-D ends python; stty size says 30 100" wait_pane '^30 100 *$'
keys 'exit 3' Enter
end=$((SECONDS + wait_s))
while [ ! -s "$work/rc" ] && [ $SECONDS -lt $end ]; do sleep 0.3; done
check "moat shell exits with the shell's code 3 ($(cat "$work/rc" 2>/dev/null))" \
	[ "$(cat "$work/rc" 2>/dev/null)" = 3 ]

# The recording: one step, its stdout an asciicast v2 file.
sid=$("$moat" --json sandbox get "$sb" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
cast_ok() {
	local end=$((SECONDS + wait_s))
	while [ $SECONDS -lt $end ]; do
		"$moat" session export "$sid" >"$work/export.json" 2>"$work/err" &&
			python3 - "$work/export.json" "$work/shell.cast" <<'EOF' && return 0
import base64, json, sys
steps = json.load(open(sys.argv[1]))["steps"]
casts = [s for s in steps if "exec /bin/sh -l" in s.get("input", "")]
if not casts:
    sys.exit(1)
raw = base64.b64decode(casts[0].get("stdout", ""))
open(sys.argv[2], "wb").write(raw)
EOF
		sleep 1
	done
	return 1
}
check "the session is a step of the recording ($sid)" cast_ok
check "moat history lists it" sh -c "'$moat' history '$sb' | grep -q 'exec /bin/sh -l'"
python3 - "$work/shell.cast" <<'EOF'
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
head = json.loads(lines[0])
assert head["version"] == 2, head
assert head["width"] == 80 and head["height"] == 24, head
assert isinstance(head["timestamp"], int), head
assert head["env"]["TERM"], head
events = [json.loads(l) for l in lines[1:]]
times = [e[0] for e in events]
assert times == sorted(times), "times go back"
assert all(e[1] in ("o", "r") for e in events), events[:3]
out = "".join(e[2] for e in events if e[1] == "o")
assert "42" in out, out[-400:]
assert ["r", "100x30"] in [e[1:] for e in events], "no resize event"
EOF
check "the step's output parses as asciicast v2 (header, monotonic, 42, resize)" [ $? -eq 0 ]
# And asciinema, the format's own player, reads it (`cat` prints the
# output; it wants a terminal, which script(1) gives it).
script -qec "asciinema cat '$work/shell.cast'" /dev/null </dev/null >"$work/cast.out" 2>&1; rc=$?
check "asciinema cat plays the cast (rc $rc, 42 in its output)" sh -c "[ $rc -eq 0 ] && grep -q 42 '$work/cast.out'"

# Bad sizes and a resize of a pipe exec, over the HTTP door.
http=http://127.0.0.1:$port
rpc() { # rpc METHOD JSON: the reply body (any status)
	curl -sS -H "Authorization: Bearer $(cat "$state/api-key")" \
		-H 'Content-Type: application/json' -d "$2" "$http/v1/rpc/$1"
}
exec_id=$(rpc ExecStart "{\"sandboxId\": \"$sb\", \"argv\": [\"sleep\", \"30\"]}" |
	python3 -c 'import json,sys; print(json.load(sys.stdin).get("execId", ""))')
check "a pipe exec starts ($exec_id)" [ -n "$exec_id" ]
rpc ExecResize "{\"sandboxId\": \"$sb\", \"execId\": \"$exec_id\", \"rows\": 0, \"cols\": 80}" >"$work/r0"
check "rows 0 is refused: $(cat "$work/r0")" grep -q 'INVALID_ARGUMENT.*out of range\|out of range.*INVALID_ARGUMENT' "$work/r0"
rpc ExecResize "{\"sandboxId\": \"$sb\", \"execId\": \"$exec_id\", \"rows\": 30, \"cols\": 100}" >"$work/r1"
check "a pipe exec is not a terminal: $(cat "$work/r1")" grep -q 'FAILED_PRECONDITION.*not a terminal\|not a terminal.*FAILED_PRECONDITION' "$work/r1"
rpc ExecKill "{\"sandboxId\": \"$sb\", \"execId\": \"$exec_id\"}" >/dev/null
# The HTTP door's terminal: the SSE exec stream with "pty": true.
curl -sN -H "Authorization: Bearer $(cat "$state/api-key")" \
	-H 'Accept: text/event-stream' -X POST "$http/v1/sandboxes/$sb/exec" \
	-d '{"shell": "stty size; [ -t 0 ] && echo tty", "pty": true, "rows": 33, "cols": 77}' \
	>"$work/sse" 2>&1
sse_out() {
	python3 - "$work/sse" <<'EOF'
import base64, json, sys
out = b""
for line in open(sys.argv[1]):
    if line.startswith("data: ") and '"data"' in line:
        out += base64.b64decode(json.loads(line[6:])["data"])
sys.exit(0 if b"33 77" in out and b"tty" in out else 1)
EOF
}
check "SSE with pty runs under a 33x77 terminal" sse_out

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
