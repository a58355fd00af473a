#!/usr/bin/env bash
# bench.plot: runs tests/bench/plot.py (with /usr/bin/python3, whose
# matplotlib is Debian's) on a copy of fixtures/ and checks that every
# chart it should draw is a PNG (its magic), that the malformed
# broken.json is named on stderr and skipped (exit 1, no traceback), and
# that a missing density.json is said, not a failure.
# Usage: test_plot.sh PLOT_PY FIXTURES_DIR
set -euo pipefail
plot=$1 fixtures=$2
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
	echo "SKIP: /usr/bin/python3 has no matplotlib (bash deploy/install-deps.sh --bench)"
	exit 77
fi
tmp=$(mktemp -d /tmp/moat-test-plot.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

png_ok() { # a file that starts with the 8-byte PNG signature
	[ -s "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
}

cp "$fixtures"/*.json "$tmp/"
rc=0
/usr/bin/python3 "$plot" "$tmp" >"$tmp/out" 2>"$tmp/err" || rc=$?
cat "$tmp/out" "$tmp/err"
[ "$rc" -eq 1 ] || fail "exit $rc, want 1 (one file skipped)"
grep -q "broken.json: not readable JSON" "$tmp/err" || fail "broken.json not reported"
! grep -q Traceback "$tmp/err" || fail "a traceback"
for name in create_vs_cold create_phases fork_scaling density load_over_time \
	create_p50_p95 create_distributions travel_p50_p95 load_series_over_time; do
	png_ok "$tmp/plots/$name.png" || fail "$name.png missing or not a PNG"
done
n=$(find "$tmp/plots" -name '*.png' | wc -l)
[ "$n" -eq "$(grep -o '[0-9]* charts' "$tmp/out" | cut -d' ' -f1)" ] ||
	fail "$n PNGs but the summary says otherwise"

# Without density.json: said, and the rest still drawn (exit 0 now).
rm "$tmp/density.json" "$tmp/broken.json"
rm -rf "$tmp/plots"
/usr/bin/python3 "$plot" "$tmp" --out "$tmp/p2" >"$tmp/out" 2>"$tmp/err" ||
	fail "exit $? without broken.json: $(cat "$tmp/err")"
grep -q "no density.json" "$tmp/err" || fail "missing density.json not said"
png_ok "$tmp/p2/create_vs_cold.png" || fail "--out not honoured"
[ ! -e "$tmp/p2/density.png" ] || fail "density.png without density.json"

# moat-bench-density's own shape (modes -> by_count) draws density.png.
cat >"$tmp/density.json" <<'JSON'
{"benchmark": "density", "modes": {
 "copy": {"by_count": [{"sandboxes": 10, "pss_mib_per_vmm": 47, "memavailable_drop_mib_per_sandbox": 83, "idle_cpu_pct_of_core_per_vmm": 0.31, "creates_per_s": 17}]},
 "private": {"by_count": [{"sandboxes": 10, "pss_mib_per_vmm": 30, "memavailable_drop_mib_per_sandbox": 6, "idle_cpu_pct_of_core_per_vmm": 0.33, "creates_per_s": 18}]}}}
JSON
/usr/bin/python3 "$plot" "$tmp" --out "$tmp/p3" >"$tmp/out" 2>"$tmp/err" ||
	fail "exit $? with the bench's density.json: $(cat "$tmp/err")"
png_ok "$tmp/p3/density.png" || fail "density.png not drawn from modes/by_count"

# Bad usage: a clear message, exit 2.
rc=0
/usr/bin/python3 "$plot" "$tmp/nope" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "is not a directory" "$tmp/err" || fail "bad dir: exit $rc"
echo PASS
