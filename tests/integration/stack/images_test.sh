#!/usr/bin/env bash
# Images through the whole stack (issue 17): `moat image push default`
# stores the default image in moat-snapd and `moat image ls` shows it
# stored on the stack's node; images/specs/datasci.ini (numpy, git, a
# file from its [files] section) builds on the node with its steps
# printed; `moat run --image NAME` runs numpy and git in it;
# `moat image rm NAME` is refused while a sandbox uses it (naming the
# sandbox) and works once it is gone; `moat image rm default` is always
# refused. Needs built binaries (MOAT_BIN_DIR), images (MOAT_IMAGE_DIR,
# default <repo>/images/out) and a node whose vmd builds (build.sh
# --spec, vmd's StartImageBuild); 77 (skipped) when the node answers
# that it cannot build images.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
state=$(mktemp -d /tmp/moat-images-stack.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
moat=$bin/moat
work=$(mktemp -d /tmp/moat-images-work.XXXXXX)
name=apitest-$$
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() { # check DESC COMMAND...: passes when the command succeeds
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	[ -n "${sid:-}" ] && "$moat" sandbox rm "$sid" >/dev/null 2>&1
	"$moat" image rm "$name" >/dev/null 2>&1
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

if ! bash "$repo/deploy/moat-stack" start >/dev/null; then
	echo "FAIL - stack starts"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
ok "stack starts"
node=$("$moat" --json node ls | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["nodeId"])')

# The default image into moat-snapd, then listed as stored on the node.
"$moat" image push default >"$work/push" 2>&1; rc=$?
check "image push default (rc $rc: $(head -c 300 "$work/push"))" [ $rc -eq 0 ]
"$moat" image ls >"$work/ls" 2>&1
check "image ls shows default stored on $node with its packages ($(tr '\n' '|' <"$work/ls"))" \
	awk -v n="$node" '$1 == "default" && $4 > 50 && $5 ~ n && $6 == "yes" { f = 1 } END { exit !f }' "$work/ls"

# The sample spec (numpy, git, a file of its own, a run line) under a
# name of the test's: images_custom built the same spec, so the node's
# build finds its root filesystem in the cache and only the cheap steps run.
mkdir -p "$work/spec"
cp "$repo/images/specs/datasci.ini" "$work/spec/$name.ini"
cp "$repo/images/specs/datasci.txt" "$work/spec/"
"$moat" image build "$work/spec/$name.ini" >"$work/build" 2>"$work/build.err"; rc=$?
if [ $rc -eq $((64 + 12)) ]; then # UNIMPLEMENTED: this vmd cannot build
	echo "skip - the node cannot build images: $(head -c 300 "$work/build.err")"
	exit 77
fi
check "image build $name (rc $rc: $(tail -c 400 "$work/build.err"))" [ $rc -eq 0 ]
check "the build printed its steps with their times" grep -qE '^\[ *[0-9]+\.[0-9]s\] ' "$work/build"
check "and the image at the end ($(tail -n 1 "$work/build"))" grep -q "^image $name: id [0-9a-f]\{12\}" "$work/build"
"$moat" image ls >"$work/ls" 2>&1
check "image ls lists $name with packages" \
	awk -v n="$name" '$1 == n && $4 > 50 { f = 1 } END { exit !f }' "$work/ls"

out=$("$moat" run --image "$name" -c 'import numpy; print(numpy.arange(3).sum())' 2>"$work/run.err"); rc=$?
check "numpy runs in $name (rc $rc: $out $(head -c 200 "$work/run.err"))" \
	sh -c "[ $rc -eq 0 ] && [ '$out' = 3 ]"
out=$("$moat" run --image "$name" -l sh -c 'git --version; cat /etc/moat/datasci.txt' 2>"$work/run.err"); rc=$?
check "git and the spec's file are in $name (rc $rc: $(echo "$out" | head -c 200))" \
	sh -c "[ $rc -eq 0 ] && echo '$out' | grep -q '^git version'"

# Refused while a sandbox uses it, naming the sandbox; then removed.
sid=$("$moat" sandbox create --image "$name" 2>"$work/err")
check "a sandbox of $name ($sid)" [ -n "$sid" ]
"$moat" image rm "$name" >"$work/rm" 2>&1; rc=$?
check "image rm refused while $sid uses it (rc $rc: $(head -c 300 "$work/rm"))" \
	sh -c "[ $rc -eq $((64 + 9)) ] && grep -q '$sid' '$work/rm'"
"$moat" sandbox rm "$sid" >/dev/null 2>&1
sid=
"$moat" image rm "$name" >"$work/rm" 2>&1; rc=$?
check "image rm works once it is unused (rc $rc: $(head -c 300 "$work/rm"))" [ $rc -eq 0 ]
"$moat" image ls >"$work/ls" 2>&1
check "and $name is no longer listed" sh -c "! grep -q '^$name ' '$work/ls'"

"$moat" image rm default >"$work/rm" 2>&1; rc=$?
check "image rm default refused (rc $rc: $(head -c 200 "$work/rm"))" \
	sh -c "[ $rc -eq $((64 + 9)) ] && grep -q 'never removed' '$work/rm'"
check "no sanitizer report in any service log" sh -c "! grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' '$state'/logs/*.log"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
