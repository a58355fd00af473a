#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, makes the
# guest images (cached), and runs every test under ctest — unit (cmocka),
# fuzz (deterministic corpora), and integration (real VMs under QEMU) —
# first in the normal build, then in the AddressSanitizer + UBSan build.
# Usage: tests/run.sh [--no-sanitize] [-- extra ctest args]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

sanitize=1
extra=()
while [ $# -gt 0 ]; do
	case "$1" in
	--no-sanitize) sanitize=0 ;;
	--) shift; extra=("$@"); break ;;
	*) echo "tests/run.sh: unknown option $1 (known: --no-sanitize, -- CTEST_ARGS)" >&2; exit 2 ;;
	esac
	shift
done

bash deploy/setup.sh --no-start
# Tests start their own services in temporary state directories; the
# images are shared.
export MOAT_IMAGE_DIR=$repo/images/out

echo "== tests (build)"
ctest --test-dir build --output-on-failure --timeout 900 "${extra[@]}"

if [ "$sanitize" -eq 1 ]; then
	echo "== sanitizer build (build-asan)"
	cmake -S . -B build-asan -DMOAT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	make -C build-asan -j"$(nproc)" --no-print-directory
	echo "== tests (build-asan: AddressSanitizer + UBSan)"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --test-dir build-asan --output-on-failure --timeout 900 "${extra[@]}"
fi
