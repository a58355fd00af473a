#!/bin/sh
# include_cycles.sh: fails when the files of services/vm depend on each
# other in a cycle. A module is a .c and its .h (sandbox.c + sandbox.h:
# "sandbox"); it depends on every module whose header its .c or .h
# includes with quotes. tsort finds the loops. Not for: system or
# library headers (moat/..., *.pb-c.h), which are not modules here.
# Usage: include_cycles.sh [services/vm directory]
set -eu
dir=${1:-$(dirname "$0")/../../../services/vm}
cd "$dir"

edges=$(mktemp)
trap 'rm -f "$edges"' EXIT

find . -name '*.[ch]' | sed 's|^\./||' | sort | while read -r f; do
	from=${f%.[ch]}
	fdir=$(dirname "$f")
	sed -n 's/^#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" |
	while read -r inc; do
		# Resolve against the including file's folder, then the root.
		if [ -f "$fdir/$inc" ]; then
			target=$(realpath -m --relative-to=. "$fdir/$inc")
		elif [ -f "$inc" ]; then
			target=$inc
		else
			continue
		fi
		to=${target%.[ch]}
		[ "$to" = "$from" ] && continue
		echo "$to $from"
	done
done >"$edges"

if ! tsort "$edges" >/dev/null 2>"$edges.err"; then
	echo "include cycle in services/vm (module: X.c + X.h):" >&2
	grep -v 'input contains a loop' "$edges.err" | sed 's/^tsort: /  /' >&2
	rm -f "$edges.err"
	exit 1
fi
rm -f "$edges.err"
echo "no include cycle among $(cut -d' ' -f2 "$edges" | sort -u | wc -l) modules"
