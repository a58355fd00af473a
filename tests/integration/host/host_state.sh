#!/usr/bin/env bash
# host_state.sh: what the test suite must leave as it found it on the
# machine that runs it: the hostname, the wall clock (as its offset
# from the boot clock, /proc/uptime, which only moves when someone sets
# the time) and the moat files in /dev/shm (guest RAM a test leaves
# there is host memory gone until reboot). `record FILE` writes them
# (ctest runs it before any test); `check FILE` compares, failing on
# another hostname, a jump of more than 5 s or a moat file in /dev/shm
# that was not there before, and names what changed.
# usage: host_state.sh record|check FILE
# Not for: restoring anything (a failure says what to put back).
set -euo pipefail
mode=${1:-}
file=${2:-}
[ -n "$file" ] || { echo "usage: host_state.sh record|check FILE" >&2; exit 2; }

shm_files() {
	find /dev/shm -maxdepth 1 -name 'moat-*' -printf '%f\n' 2>/dev/null | sort
}

offset() {
	awk -v now="$(date +%s.%N)" '{ printf "%.3f\n", now - $1 }' /proc/uptime
}

case $mode in
record)
	{ hostname; offset; } >"$file.tmp"
	shm_files >"$file.shm"
	mv "$file.tmp" "$file"
	;;
check)
	[ -f "$file" ] || { echo "FAIL - no host state recorded at $file (ctest records it when it starts)"; exit 1; }
	{ read -r host_then; read -r offset_then; } <"$file"
	host_now=$(hostname)
	offset_now=$(offset)
	rc=0
	if [ "$host_now" != "$host_then" ]; then
		echo "FAIL - the hostname changed during the tests: $host_then -> $host_now (put it back: hostname $host_then)"
		rc=1
	fi
	jump=$(awk -v a="$offset_then" -v b="$offset_now" 'BEGIN { d = b - a; if (d < 0) d = -d; printf "%.3f", d }')
	if awk -v d="$jump" 'BEGIN { exit !(d > 5) }'; then
		echo "FAIL - the wall clock jumped by $jump s during the tests"
		rc=1
	fi
	left=$(shm_files | comm -13 "$file.shm" - 2>/dev/null | head -n 20 | tr '\n' ' ')
	if [ -n "$left" ]; then
		echo "FAIL - the tests left moat files in /dev/shm (guest RAM held until reboot): $left(remove them: cd /dev/shm && rm -rf $left)"
		rc=1
	fi
	[ $rc -eq 0 ] && echo "ok - hostname $host_now and the wall clock (moved $jump s against the boot clock) are as the tests found them"
	exit $rc
	;;
*)
	echo "usage: host_state.sh record|check FILE" >&2
	exit 2
	;;
esac
