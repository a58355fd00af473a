# Time travel, sourced by stack_test.sh (uses its $moat, $work, $state,
# check, ok, bad): a session recorded with --snapshot every whose step 1
# leaves a process running; restore to step 2 (files as recorded then,
# later files gone, the process alive); a step without a snapshot refused
# with FAILED_PRECONDITION; a fork of 3 copies that do not see each
# other's files; a replay that comes out the same; and moat-sessiond
# stopped: session calls fail fast with UNAVAILABLE while execs on a
# recorded sandbox still run. MOAT_STACK_ONLY=travel runs only this.

json_get() { # json_get FILE EXPR: python expression on d = the JSON
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# Python variables through restore: five recorded steps (code runs in a
# persistent context and a file write between them); restoring to step 2
# brings back the interpreter's variables and the file as they were then.
travel_code_part() {
	local cid out rc
	cid=$("$moat" sandbox create --record --snapshot every 2>"$work/err")
	check "travel code: recorded sandbox ($cid)" [ -n "$cid" ]
	"$moat" code "$cid" -c 'import hashlib; x = 1; open("/root/v.txt", "w").write("one")' >/dev/null 2>>"$work/err"
	"$moat" code "$cid" -c 'x = 2; y = [1, 2]; open("/root/v.txt", "a").write("two")' >/dev/null 2>>"$work/err"
	"$moat" exec "$cid" -- sh -c 'echo three >/root/three.txt' >/dev/null 2>>"$work/err"
	"$moat" code "$cid" -c 'x = 4; del y; open("/root/v.txt", "w").write("four")' >/dev/null 2>>"$work/err"
	out=$("$moat" code "$cid" -c 'x = 5; x' 2>>"$work/err")
	check "travel code: five steps ran ($out)" [ "$out" = 5 ]
	check "travel code: every step recorded" [ "$("$moat" history "$cid" | grep -c '\[snapshot\]')" -eq 5 ]
	"$moat" restore "$cid" --step 2 >/dev/null 2>"$work/err"; rc=$?
	check "travel code: restore to step 2 (rc $rc)" [ $rc -eq 0 ]
	out=$("$moat" code "$cid" -c 'print(x, y, hashlib.sha256(open("/root/v.txt", "rb").read()).hexdigest()[:12])' 2>"$work/err")
	check "travel code: variables, import and file as at step 2 ($out)" [ "$out" = "2 [1, 2] $(printf onetwo | sha256sum | cut -c1-12)" ]
	"$moat" exec "$cid" -- test ! -e /root/three.txt >/dev/null 2>&1; rc=$?
	check "travel code: step 3's file is gone (rc $rc)" [ $rc -eq 0 ]
	"$moat" sandbox rm "$cid" >/dev/null 2>&1
}

travel_section() {
	travel_code_part
	local tid tsid rid rsid out rc h2 now mid msid line i t0 t1
	local -a fsb

	tid=$("$moat" sandbox create --record --snapshot every 2>"$work/err")
	check "travel: sandbox create --record --snapshot every ($tid)" [ -n "$tid" ]
	"$moat" --json sandbox get "$tid" >"$work/tsb.json"
	tsid=$(json_get "$work/tsb.json" 'd.get("sessionId", "")')
	check "travel: it records into a session ($tsid)" [ -n "$tsid" ]

	# Five steps: a background process and files created, modified,
	# deleted.
	"$moat" exec "$tid" -- sh -c 'setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $! >/root/bg.pid; echo one >/root/one.txt' 2>"$work/err"; rc=$?
	check "travel: step 1 starts a background process (rc $rc)" [ $rc -eq 0 ]
	check "travel: step 1 was recorded with its snapshot" sh -c "! grep -q 'not recorded' '$work/err'"
	"$moat" exec "$tid" -- sh -c 'echo more >>/root/one.txt; head -c 20000 /dev/urandom >/root/two.bin' 2>>"$work/err"; rc=$?
	check "travel: step 2 (rc $rc)" [ $rc -eq 0 ]
	"$moat" exec "$tid" -- sh -c 'echo three >/root/three.txt' 2>>"$work/err"; rc=$?
	check "travel: step 3 (rc $rc)" [ $rc -eq 0 ]
	"$moat" exec "$tid" -- sh -c 'rm /root/two.bin; echo changed >/root/one.txt' 2>>"$work/err"; rc=$?
	check "travel: step 4 (rc $rc)" [ $rc -eq 0 ]
	"$moat" exec "$tid" -- sh -c 'echo five >/root/five.txt' 2>>"$work/err"; rc=$?
	check "travel: step 5 (rc $rc)" [ $rc -eq 0 ]
	check "travel: no step lost its recording or snapshot" sh -c "! grep -q 'not recorded' '$work/err'"
	"$moat" history "$tid" >"$work/thist"
	check "travel: every step has a snapshot" [ "$(grep -c '\[snapshot\]' "$work/thist")" -eq 5 ]

	# The hashes step 2 recorded (sha256 is base64 in proto3 JSON).
	"$moat" session export "$tsid" >"$work/texport.json"
	h2=$(json_get "$work/texport.json" '" ".join(__import__("base64").b64decode(e["sha256"]).hex() + ":" + e["path"] for e in sorted(d["steps"][1]["fsTrace"], key=lambda e: e["path"]) if e.get("sha256"))')
	check "travel: step 2 recorded the hashes of one.txt and two.bin" sh -c "echo '$h2' | grep -q one.txt && echo '$h2' | grep -q two.bin"

	# Restore in place to step 2.
	rid=$("$moat" restore "$tid" --step 2 2>"$work/err"); rc=$?
	check "travel: restore to step 2 (rc $rc, $rid)" [ $rc -eq 0 -a -n "$rid" ]
	[ $rc -eq 0 ] || cat "$work/err"
	now=$("$moat" exec "$rid" -- sh -c 'cd /root && for f in one.txt two.bin; do echo "$(sha256sum $f | cut -d" " -f1):/root/$f"; done' 2>/dev/null | tr '\n' ' ' | sed 's/ $//')
	check "travel: files hash as recorded at step 2" [ "$now" = "$h2" ]
	"$moat" exec "$rid" -- sh -c 'test ! -e /root/three.txt && test ! -e /root/five.txt' 2>/dev/null; rc=$?
	check "travel: files of steps 3 and 5 are gone (rc $rc)" [ $rc -eq 0 ]
	"$moat" exec "$rid" -- sh -c 'kill -0 "$(cat /root/bg.pid)"' 2>/dev/null; rc=$?
	check "travel: the process step 1 started is alive (rc $rc)" [ $rc -eq 0 ]
	"$moat" --json sandbox get "$rid" >"$work/rsb.json"
	rsid=$(json_get "$work/rsb.json" 'd.get("sessionId", "")')
	check "travel: the restored sandbox records into a new session ($rsid)" [ -n "$rsid" -a "$rsid" != "$tsid" ]
	"$moat" session export "$rsid" >"$work/rses.json" 2>/dev/null
	check "travel: its session branches from step 2" [ "$(json_get "$work/rses.json" 'd["session"]["parentSessionId"] + ":" + str(d["session"]["parentStep"])')" = "$tsid:2" ]
	if [ "$rid" != "$tid" ]; then
		"$moat" sandbox get "$tid" >/dev/null 2>&1; rc=$?
		check "travel: the replaced sandbox is gone (rc $rc)" [ $rc -eq 69 ]
	fi

	# A step without a snapshot: refused, and the message says why.
	mid=$("$moat" sandbox create --record 2>/dev/null)
	msid=$("$moat" --json sandbox get "$mid" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("sessionId", ""))')
	"$moat" exec "$mid" -- sh -c 'echo hello; echo warn >&2' >/dev/null 2>&1
	"$moat" exec "$mid" -- sh -c 'echo x >/root/x; cat /root/x; exit 3' >/dev/null 2>&1
	"$moat" restore "$mid" --step 1 2>"$work/err"; rc=$?
	check "travel: step without snapshot -> FAILED_PRECONDITION exit 73 (rc $rc)" [ $rc -eq 73 ]
	check "travel: the message says how to get snapshots" grep -q "snapshot create" "$work/err"
	"$moat" restore "$mid" --step 9 2>"$work/err"; rc=$?
	check "travel: unknown step -> NOT_FOUND exit 69 (rc $rc)" [ $rc -eq 69 ]
	"$moat" restore "$mid" --step 1 --session ses-0000000000000000 2>"$work/err"; rc=$?
	check "travel: unknown session -> NOT_FOUND exit 69 (rc $rc)" [ $rc -eq 69 ]
	out=$("$moat" snapshot create "$mid" 2>"$work/err"); rc=$?
	check "travel: snapshot create ($out, rc $rc)" [ $rc -eq 0 -a -n "$out" ]
	check "travel: manual snapshot lands on the latest step" sh -c "'$moat' history '$mid' | grep -E '^2 ' | grep -q '\[snapshot\]'"
	check "travel: snapshot ls lists it" sh -c "'$moat' snapshot ls | grep -q '$out'"
	"$moat" restore "$mid" --step 1 2>"$work/err"; rc=$?
	check "travel: step 1 still has none -> exit 73 naming step 2 (rc $rc)" sh -c "[ $rc -eq 73 ] && grep -q 'steps with one: 2' '$work/err'"

	# Fork 3 copies from step 3 of the first session.
	"$moat" fork "$tsid" --step 3 --count 3 >"$work/fork" 2>"$work/err"; rc=$?
	check "travel: fork 3 copies (rc $rc)" [ $rc -eq 0 -a "$(wc -l <"$work/fork")" -eq 3 ]
	[ $rc -eq 0 ] || cat "$work/err"
	mapfile -t fsb < <(cut -d' ' -f1 "$work/fork")
	for i in 0 1 2; do
		"$moat" exec "${fsb[$i]}" -- sh -c "echo $i >/root/fork-$i" >/dev/null 2>&1
	done
	for i in 0 1 2; do
		out=$("$moat" exec "${fsb[$i]}" -- sh -c 'ls /root | grep "^fork-" | tr "\n" " "; test -e /root/three.txt && echo has-three' 2>/dev/null)
		check "travel: fork copy $i sees only its own file ($out)" [ "$out" = "fork-$i has-three" ]
	done

	# Replay the deterministic manual session.
	"$moat" --json replay "$msid" >"$work/replay.json" 2>"$work/err"; rc=$?
	check "travel: replay (rc $rc)" [ $rc -eq 0 ]
	check "travel: replay's steps all match" [ "$(json_get "$work/replay.json" 'str(d.get("stepsReplayed")) + "/" + str(d.get("stepsMatching"))')" = "2/2" ]

	# Step 0 (the state before step 1) into a new sandbox.
	out=$("$moat" restore "$rid" --step 0 --session "$tsid" --new 2>"$work/err"); rc=$?
	check "travel: restore step 0 --new ($out, rc $rc)" [ $rc -eq 0 -a -n "$out" -a "$out" != "$rid" ]
	"$moat" exec "$out" -- sh -c 'test ! -e /root/one.txt && test ! -e /root/bg.pid' >/dev/null 2>&1; rc=$?
	check "travel: step 0 holds none of step 1's files (rc $rc)" [ $rc -eq 0 ]
	"$moat" sandbox rm "$out" >/dev/null 2>&1

	# A policy made stricter after recording holds for a replay too: with
	# writes refused, the replay of the manual session runs step 1 and
	# refuses step 2 (it writes /root/x).
	restart_gateway() {
		kill -TERM "$(cat "$state/run/gateway.pid")"
		for _ in $(seq 1 50); do
			kill -0 "$(cat "$state/run/gateway.pid")" 2>/dev/null || break
			sleep 0.1
		done
		"$@" bash "$repo/deploy/moat-stack" start >/dev/null 2>&1
	}
	restart_gateway env MOAT_POLICY_REFUSE=write,destructive,system,blocked
	"$moat" --json replay "$msid" >"$work/replay.json" 2>"$work/err"; rc=$?
	check "travel: replay under a stricter policy differs (rc $rc)" [ $rc -eq 1 ]
	check "travel: ... one step refused, one the same" [ "$(json_get "$work/replay.json" 'str(d.get("stepsRefused")) + "/" + str(d.get("stepsMatching")) + "/" + str(d.get("firstDivergentStep"))')" = "1/1/2" ]
	check "travel: ... the refused step never ran" sh -c "grep -q 'replay step 2 in .* not run: the policy of tenant' '$state/logs/gateway.log'"
	restart_gateway env

	# A restarted gateway finds the sandbox's session again.
	local before after
	before=$("$moat" history "$rid" | grep -cE '^[0-9]+ +exec ')
	kill -TERM "$(cat "$state/run/gateway.pid")"
	for _ in $(seq 1 50); do
		kill -0 "$(cat "$state/run/gateway.pid")" 2>/dev/null || break
		sleep 0.1
	done
	bash "$repo/deploy/moat-stack" start >/dev/null 2>&1
	"$moat" exec "$rid" -- echo after >/dev/null 2>"$work/err"; rc=$?
	after=$("$moat" history "$rid" | grep -cE '^[0-9]+ +exec ')
	check "travel: after a gateway restart execs still record ($before -> $after, rc $rc)" [ $rc -eq 0 -a "$after" -eq $((before + 1)) ]
	check "travel: ... with their snapshot" sh -c "! grep -q 'not recorded' '$work/err'"

	# moat-sessiond down: session calls fail fast, execs still run.
	kill -TERM "$(cat "$state/run/sessiond.pid")"
	for _ in $(seq 1 50); do
		kill -0 "$(cat "$state/run/sessiond.pid")" 2>/dev/null || break
		sleep 0.1
	done
	t0=$SECONDS
	"$moat" history "$rid" 2>"$work/err"; rc=$?
	t1=$SECONDS
	check "travel: sessiond down -> history UNAVAILABLE exit 78 (rc $rc)" [ $rc -eq 78 ]
	check "travel: ... within 10 s ($((t1 - t0)) s)" [ $((t1 - t0)) -le 10 ]
	out=$("$moat" exec "$rid" -- echo still 2>"$work/err"); rc=$?
	check "travel: exec on the recorded sandbox still runs ($out, rc $rc)" [ "$out" = still -a $rc -eq 0 ]
	check "travel: ... and says it was not recorded" grep -q "not recorded" "$work/err"
	bash "$repo/deploy/moat-stack" start >/dev/null 2>&1
	"$moat" history "$rid" >/dev/null 2>&1; rc=$?
	check "travel: sessiond restarted: history works again (rc $rc)" [ $rc -eq 0 ]

	for i in "${fsb[@]}" "$rid" "$mid"; do
		"$moat" sandbox rm "$i" >/dev/null 2>&1
	done
}
