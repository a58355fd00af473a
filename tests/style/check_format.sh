#!/usr/bin/env bash
# check_format.sh: every tracked C file is formatted as .clang-format
# says (clang-format --dry-run -Werror). Exit 77 (skipped) when this is
# not a git checkout or clang-format is not the major version the style
# was settled with: another version formats some constructs differently,
# and a failure then would say nothing about the code.
# Fix a failure with: git ls-files '*.c' '*.h' | xargs clang-format -i
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
want=14

if ! command -v clang-format >/dev/null; then
	echo "SKIP: clang-format is not installed (deploy/setup.sh installs it)"
	exit 77
fi
have=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [ "$have" != "$want" ]; then
	echo "SKIP: clang-format $have here; the style is checked with $want"
	exit 77
fi
if ! git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
	echo "SKIP: $repo is not a git checkout (the tracked files are checked)"
	exit 77
fi

cd "$repo"
mapfile -t files < <(git ls-files '*.c' '*.h')
if ! clang-format --dry-run -Werror "${files[@]}"; then
	echo "FAIL: files above differ from .clang-format; fix with:" \
	    "git ls-files '*.c' '*.h' | xargs clang-format -i"
	exit 1
fi
echo "ok: ${#files[@]} files formatted as .clang-format says"
