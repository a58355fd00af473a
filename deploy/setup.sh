#!/usr/bin/env bash
# The first README command: installs dependencies, builds everything,
# makes the guest images and starts the local stack. Safe to re-run: the
# build is incremental and images are cached by content hash.
# Options: --no-start (stop after images), --sanitize (ASan/UBSan build
# in build-asan/).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

start=1
build_dir=build
cmake_extra=()
for a in "$@"; do
	case "$a" in
	--no-start) start=0 ;;
	--sanitize) build_dir=build-asan; cmake_extra+=(-DMOAT_SANITIZE=ON) ;;
	*) echo "setup.sh: unknown option $a (known: --no-start --sanitize)" >&2; exit 2 ;;
	esac
done

echo "== dependencies"
bash deploy/install-deps.sh
echo "== nng (with moat's fix; cached in .deps/nng)"
nice -n 10 bash deploy/build-nng.sh
echo "== build ($build_dir)"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_extra[@]}" >/dev/null
make -C "$build_dir" -j"$(nproc)" --no-print-directory
echo "== guest images"
bash images/build.sh --agent "$repo/$build_dir/bin/moat-agent" --out "$repo/images/out"
if [ "$start" -eq 1 ]; then
	echo "== local stack"
	MOAT_BIN_DIR="$repo/$build_dir/bin" bash deploy/moat-stack restart
	echo
	echo "Ready. Try: $repo/$build_dir/bin/moat run -c 'print(6*7)'"
fi
