#!/usr/bin/env bash
# campaign.sh: runs libFuzzer targets one after another, each for SECONDS,
# from its seed corpus (tests/fuzz/corpus/<target>, copied: the corpus it
# grows stays in the work dir), and prints one line per target: the
# executions, the edges covered (cov), features (ft), the corpus size,
# the peak RSS and any crash file. Needs a libFuzzer build:
#   CC=clang cmake -S . -B build-fuzz -DMOAT_LIBFUZZER=ON -DMOAT_SANITIZE=ON \
#     -DCMAKE_C_FLAGS=-Wno-error=format-nonliteral
#   make -C build-fuzz fuzz_http_route ...
# Usage: tests/fuzz/campaign.sh BUILD_DIR SECONDS WORK_DIR TARGET...
# (TARGET without the fuzz_ prefix). A crash leaves crash-* in
# WORK_DIR/<target>/; fix it, then add the input under
# tests/fuzz/regress/<target>/ (the ctest fuzz_<target>_regress runs it).
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: $0 BUILD_DIR SECONDS WORK_DIR TARGET..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd) secs=$2 work=$(mkdir -p "$3" && cd "$3" && pwd)
shift 3
mkdir -p "$work"
for t in "$@"; do
	bin=$build/bin/fuzz_$t
	[ -x "$bin" ] || { echo "$t: no $bin (build it first)"; continue; }
	mkdir -p "$work/$t/corpus"
	cp -n "$here/corpus/$t/"* "$work/$t/corpus/" 2>/dev/null
	t0=$(date +%s)
	(cd "$work/$t" && "$bin" -max_total_time="$secs" -print_final_stats=1 \
		-timeout=10 -rss_limit_mb=2048 corpus >log 2>&1)
	rc=$?
	ran=$(($(date +%s) - t0))
	execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t/log" | awk '{print $2}')
	rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$work/$t/log" | awk '{print $2}')
	last=$(grep -E '^#[0-9]+' "$work/$t/log" | tail -1)
	cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
	ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
	corp=$(echo "$last" | grep -o 'corp: [0-9]*' | awk '{print $2}')
	crashes=$(ls "$work/$t" | grep -E '^(crash|leak|timeout|oom)-' | tr '\n' ' ')
	echo "$t: rc $rc, ${execs:-?} execs in ${ran} s, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, peak RSS ${rss:-?} MB, findings: ${crashes:-none}"
done
