#!/usr/bin/env bash
# Issue 11 through the whole stack, with real VMs: a stack of its own
# with a 300 MiB snapshot RAM budget and retention "keep the last 3"
# (MOAT_RETENTION_KEEP_LAST=3, MOAT_RETENTION_KEEP_AGE_S=0). A session of
# six steps with a snapshot after each and step 2 pinned (--keep) keeps
# the snapshots of steps 2 and 4-6; restoring step 1 is refused
# (FAILED_PRECONDITION naming the steps that still have one); some
# copies are evicted to disk and one restores exactly; deleting the
# session deletes its snapshots on the node and in moat-snapd but keeps
# the one a forked session still starts from; gc removes what nothing
# names; Shmem goes back to where it started.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
state=$(mktemp -d /tmp/moat-snaps-test.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
export MOAT_VMD_SNAPSHOT_RAM_MIB=300
export MOAT_RETENTION_KEEP_LAST=3 MOAT_RETENTION_KEEP_AGE_S=0
# No template: its RAM copy is the node's own and would stay in Shmem.
export MOAT_VMD_TEMPLATES=off
# The stack's HTTP door is not used here: keep it off the default port.
export MOAT_GATEWAY_HTTP=off MOAT_GATEWAY_GRPC=off
moat=$bin/moat
work=$(mktemp -d /tmp/moat-snaps-work.XXXXXX)
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
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT
py() { /usr/bin/python3 -c "$@"; }
shmem_kib() { awk '/^Shmem:/ {print $2}' /proc/meminfo; }
# steps_json SANDBOX: the sandbox's latest session's steps (moat history).
steps_json() { "$moat" --json history "$1" 2>>"$work/err"; }
# snap_of FILE STEP: the snapshot id step STEP has in history FILE.
snap_of() {
	py 'import json,sys
d = json.load(open(sys.argv[1]))
steps = d.get("steps", d) if isinstance(d, dict) else d
for s in steps:
    if int(s.get("index", 0)) == int(sys.argv[2]):
        print(s.get("snapshotId", ""))' "$1" "$2"
}
removed_of() {
	py 'import json,sys
d = json.load(open(sys.argv[1]))
steps = d.get("steps", d) if isinstance(d, dict) else d
for s in steps:
    if int(s.get("index", 0)) == int(sys.argv[2]):
        print(s.get("snapshotRemoved", ""))' "$1" "$2"
}
# local_snaps: "ID LOCATION" per snapshot the node lists.
local_snaps() {
	"$moat" --json snapshot ls 2>>"$work/err" | py 'import json,sys
d = json.load(sys.stdin)
for s in d.get("snapshots", []):
    print(s["snapshotId"], s.get("location", "ram"))'
}

if ! bash "$repo/deploy/moat-stack" start; then
	bad "stack starts"
	tail -n 30 "$state"/logs/*.log
	echo "$passed passed, $failed failed"
	exit 1
fi
ok "stack starts with a 300 MiB snapshot budget and keep-last 3"
shm0=$(shmem_kib)
# The RAM filesystem (an XFS on a sparse file in /dev/shm) writes its own
# metadata, the 64 MiB log first, as it is used: what df counts as used
# in it now that its backing file does not hold yet is Shmem to come
# that no snapshot causes.
meta_kib=0
if dev=$(findmnt -n -o SOURCE --target "$state/ram" 2>/dev/null) &&
	img=$(losetup -n -O BACK-FILE "$dev" 2>/dev/null) && [ -f "$img" ]; then
	meta_kib=$(( $(df -k --output=used "$state/ram" | tail -1) - $(du -k "$img" | cut -f1) ))
	[ $meta_kib -lt 0 ] && meta_kib=0
fi
allow_kib=$((65536 + meta_kib))

sb=$("$moat" sandbox create --record --snapshot every 2>"$work/err")
check "recorded sandbox ($sb)" [ -n "$sb" ]
ses=$("$moat" --json sandbox get "$sb" | py 'import json,sys; print(json.load(sys.stdin).get("sessionId",""))')
check "it records into a session ($ses)" [ -n "$ses" ]
for i in 1 2 3 4 5 6; do
	keep=()
	[ $i -eq 2 ] && keep=(--keep)
	"$moat" exec "${keep[@]}" "$sb" -- sh -c "head -c 3000000 /dev/urandom >/root/f$i && sha256sum /root/f$i | cut -c1-64" >"$work/sum$i" 2>>"$work/err"
	rc=$?
	check "step $i (rc $rc)${keep[*]:+ pinned}" [ $rc -eq 0 -a -s "$work/sum$i" ]
done
check "no step lost its snapshot" sh -c "! grep -q 'not recorded' '$work/err'"
steps_json "$sb" >"$work/h.json"
for i in 2 4 5 6; do
	check "step $i keeps its snapshot" [ -n "$(snap_of "$work/h.json" $i)" ]
done
for i in 1 3; do
	check "step $i's snapshot was removed by retention ($(removed_of "$work/h.json" $i))" \
		sh -c "[ -z '$(snap_of "$work/h.json" $i)' ] && echo '$(removed_of "$work/h.json" $i)' | grep -q retention"
done
"$moat" restore "$sb" --step 1 --new >"$work/out" 2>"$work/err"; rc=$?
check "restore of step 1 -> FAILED_PRECONDITION exit 73 (rc $rc)" [ $rc -eq 73 ]
check "its message says retention removed it and names steps 2 and 4 ($(head -c 300 "$work/err"))" \
	sh -c "grep -q retention '$work/err' && grep -q 2 '$work/err' && grep -q 4 '$work/err'"

local_snaps >"$work/ls"
n_ses=$(grep -c . "$work/ls")
check "the node holds 4 snapshots ($n_ses)" [ "$n_ses" -eq 4 ]
check "the budget evicted at least one to disk ($(tr '\n' ' ' <"$work/ls"))" grep -q " disk" "$work/ls"
"$moat" info >"$work/info" 2>&1
check "moat info shows the snapshot RAM budget" grep -qi "snapshot" "$work/info"

# An evicted one restores exactly.
ev=$(awk '$2 == "disk" {print $1; exit}' "$work/ls")
ev_step=$(py 'import json,sys
d = json.load(open(sys.argv[1]))
steps = d.get("steps", d) if isinstance(d, dict) else d
for s in steps:
    if s.get("snapshotId") == sys.argv[2]:
        print(s["index"])' "$work/h.json" "$ev")
rid=$("$moat" restore "$sb" --step "$ev_step" --new 2>"$work/err"); rc=$?
check "restore of evicted step $ev_step --new (rc $rc, $rid)" [ $rc -eq 0 -a -n "$rid" ]
for i in $(seq 1 "$ev_step"); do
	got=$("$moat" exec "$rid" -- sh -c "sha256sum /root/f$i | cut -c1-64" 2>/dev/null)
	check "file of step $i hashes as recorded" [ "$got" = "$(cat "$work/sum$i")" ]
done
"$moat" exec "$rid" -- test ! -e "/root/f$((ev_step + 1))" >/dev/null 2>&1; rc=$?
check "no file of a later step (rc $rc)" [ $rc -eq 0 ]
rses=$("$moat" --json sandbox get "$rid" | py 'import json,sys; print(json.load(sys.stdin).get("sessionId",""))')

# A fork of step 5 starts a session whose step 0 is that snapshot.
s5=$(snap_of "$work/h.json" 5)
"$moat" fork "$ses" --step 5 >"$work/fork" 2>"$work/err"; rc=$?
read -r fsb fses <"$work/fork"
check "fork of step 5 (rc $rc, $fsb $fses)" [ $rc -eq 0 -a -n "$fses" ]

"$moat" session rm "$ses" >"$work/rm" 2>&1; rc=$?
check "session rm (rc $rc: $(tr '\n' ' ' <"$work/rm"))" [ $rc -eq 0 ]
local_snaps >"$work/ls2"
for i in 2 4 6; do
	s=$(snap_of "$work/h.json" $i)
	check "step $i's snapshot is gone from the node" sh -c "! grep -q '^$s ' '$work/ls2'"
done
check "step 5's snapshot stays: the fork's session starts from it" grep -q "^$s5 " "$work/ls2"
n_del=$(grep -c "deleted from moat-snapd" "$state/logs/vmd.log")
check "their copies were deleted in moat-snapd too ($n_del)" [ "$n_del" -ge 3 ]
"$moat" snapshot gc --dry-run >"$work/gc" 2>&1; rc=$?
check "gc --dry-run (rc $rc) finds nothing of the deleted session: $(tr '\n' ' ' <"$work/gc" | head -c 300)" \
	sh -c "[ $rc -eq 0 ] && ! grep -q \"$(snap_of "$work/h.json" 4)\" '$work/gc'"
# The fork's path goes on from step 5 (issue 18): its branch point, the
# shared snapshot, is its own too.
rid2=$("$moat" restore "$fsb" --session "$fses" --step 5 --new 2>"$work/err"); rc=$?
check "the fork's branch point (step 5, the shared snapshot) still restores (rc $rc)" [ $rc -eq 0 -a -n "$rid2" ]
got=$("$moat" exec "$rid2" -- sh -c "sha256sum /root/f5 | cut -c1-64" 2>/dev/null)
check "with step 5's file" [ "$got" = "$(cat "$work/sum5")" ]

# Everything goes: sandboxes, the other sessions, then gc.
"$moat" sandbox rm "$sb" "$rid" "$fsb" "$rid2" >/dev/null 2>&1
for s in $("$moat" --json session ls 2>/dev/null | py 'import json,sys
for s in json.load(sys.stdin).get("sessions", []): print(s["id"])'); do
	"$moat" session rm "$s" >/dev/null 2>&1
done
"$moat" snapshot gc --min-age 0 >"$work/gc2" 2>&1; rc=$?
check "gc --min-age 0 (rc $rc)" [ $rc -eq 0 ]
left=$(local_snaps | grep -c .)
check "no snapshot is left on the node ($left)" [ "$left" -eq 0 ]
for _ in $(seq 1 20); do
	[ "$(shmem_kib)" -le $((shm0 + allow_kib)) ] && break
	sleep 0.5
done
check "Shmem is back within 64 MiB (+ $meta_kib KiB of the RAM filesystem's own metadata) of its start ($shm0 -> $(shmem_kib) KiB)" [ "$(shmem_kib)" -le $((shm0 + allow_kib)) ]
if [ "$(shmem_kib)" -gt $((shm0 + allow_kib)) ]; then
	echo "# what the RAM dir holds:"; ls -las "$state/ram" 2>&1 | head -20
	df -k "$state/ram" /dev/shm 2>&1; ls -las /dev/shm | head -20
	pgrep -fa "qemu-system" | cut -c1-120
	for p in /proc/[0-9]*; do ls -l "$p/fd" 2>/dev/null | grep -q "$state/ram" && echo "$p $(tr '\0' ' ' <"$p/cmdline" | cut -c1-80): $(ls -l "$p/fd" | grep -c "$state/ram") open"; done
	xfs_info "$state/ram" 2>/dev/null | head -3
fi
check "no VMM was killed by a signal" sh -c "! grep -q 'killed by signal' '$state'/logs/*.log"
bash "$repo/deploy/moat-stack" stop >/dev/null
check "no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$state'/logs/*.log"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
