#!/usr/bin/env bash
# Builds nng from Debian's own source package with moat's fix for a
# listener that stops accepting once a peer disconnects during the SP
# handshake (upstream issue #1518, fixed in nng 1.6.0; Debian 12 ships
# 1.5.2): deploy/patches/nng-*.patch on top of Debian's patches. Installs
# a static libnng with its CMake config into .deps/nng (CMakeLists.txt
# looks there first), so moat's binaries carry the fix.
# Cached: does nothing when the prefix holds a build of the same source
# package, patches and options. The source comes through apt with the
# host's own Debian mirror (its "deb" entries, as a "deb-src" entry in a
# private apt directory: the host's apt configuration is not touched).
# Skipped when the host's libnng-dev is 1.6.0 or newer, or with
# MOAT_SYSTEM_NNG=1.
# Usage: deploy/build-nng.sh [--force]
# Env: MOAT_NNG_PREFIX (default <repo>/.deps/nng), MOAT_NNG_JOBS (default 2).
# Not for: installing packages (install-deps.sh) or building moat (setup.sh).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${MOAT_NNG_PREFIX:-$repo/.deps/nng}
work=$repo/.deps/nng-work
jobs=${MOAT_NNG_JOBS:-2}
force=0
for a in "$@"; do
	case "$a" in
	--force) force=1 ;;
	*) echo "build-nng.sh: unknown option $a (known: --force)" >&2; exit 2 ;;
	esac
done
say() { echo "build-nng: $*"; }

if [ "${MOAT_SYSTEM_NNG:-0}" = 1 ]; then
	say "MOAT_SYSTEM_NNG=1: using the system nng"
	exit 0
fi
sysver=$(dpkg-query -W -f='${Version}' libnng-dev 2>/dev/null || true)
if [ -n "$sysver" ] && dpkg --compare-versions "$sysver" ge 1.6.0; then
	say "system libnng-dev $sysver has the fix (nng >= 1.6.0): nothing to build"
	exit 0
fi

# The cmake options of the build (Debian's compiler flags, as its own
# package build uses); part of the cache key.
opts=(-DCMAKE_BUILD_TYPE=None
	"-DCMAKE_C_FLAGS=$(dpkg-buildflags --get CPPFLAGS) $(dpkg-buildflags --get CFLAGS)"
	-DBUILD_SHARED_LIBS=OFF
	-DCMAKE_POSITION_INDEPENDENT_CODE=ON -DNNG_ENABLE_TLS=ON
	-DNNG_TESTS=OFF -DNNG_TOOLS=OFF -DNNG_ENABLE_NNGCAT=OFF
	-DCMAKE_INSTALL_LIBDIR=lib)
patches=("$repo"/deploy/patches/nng-*.patch)

# deb_entries: "URI SUITE... | SIGNED-BY" for each of the host's Debian
# entries of type deb with component main (deb822 .sources, then
# one-line sources.list files).
deb_entries() {
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk '
		function flush() {
			if (types ~ /(^| )deb( |$)/ && comps ~ /(^| )main( |$)/ && uris != "")
				print uris "|" suites "|" signed
			types = uris = suites = comps = signed = ""
		}
		/^[ \t]*#/ { next }
		/^[ \t]*$/ { flush(); next }
		{
			k = tolower($1); sub(/:$/, "", k); $1 = ""; sub(/^ +/, "")
			if (k == "types") types = $0
			else if (k == "uris") uris = $0
			else if (k == "suites") suites = $0
			else if (k == "components") comps = $0
			else if (k == "signed-by") signed = $0
		}
		END { flush() }' "$f"
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		# deb [opts] URI SUITE COMPONENT...
		awk '$1 == "deb" {
			i = 2; signed = ""
			if ($2 ~ /^\[/) {
				while (i <= NF) {
					if ($i ~ /signed-by=/) { s = $i; sub(/.*signed-by=/, "", s); sub(/\]$/, "", s); signed = s }
					if ($i ~ /\]$/) { i++; break }
					i++
				}
			}
			uri = $i; suite = $(i + 1); main = 0
			for (j = i + 2; j <= NF; j++) if ($j == "main") main = 1
			if (main) print uri "|" suite "|" signed
		}' "$f"
	done
}

# fetch_source: the Debian source package of nng (the version of the
# installed libnng-dev when there is one) into $work/src, once.
fetch_source() {
	local apt=$work/apt entries want
	if ls "$work"/src/nng_*.dsc >/dev/null 2>&1; then
		return 0
	fi
	entries=$(deb_entries)
	if [ -z "$entries" ]; then
		echo "build-nng: no Debian 'deb' entry with component main in /etc/apt/sources.list or" >&2
		echo "build-nng: /etc/apt/sources.list.d/*.sources: cannot fetch nng's source package." >&2
		echo "build-nng: add one, or put the source package (nng_*.dsc and its files) in $work/src" >&2
		exit 1
	fi
	rm -rf "$apt" "$work/src"
	mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$work/src"
	: >"$apt/parts/src.sources"
	while IFS='|' read -r uris suites signed; do
		{
			echo "Types: deb-src"
			echo "URIs: $uris"
			echo "Suites: $suites"
			echo "Components: main"
			[ -n "$signed" ] && echo "Signed-By: $signed"
			echo
		} >>"$apt/parts/src.sources"
	done <<<"$entries"
	local aptopts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt/parts"
		-o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache"
		-o Dir::State::Status=/var/lib/dpkg/status -o APT::Sandbox::User=root
		-o Debug::NoLocking=1)
	say "fetching nng's source package"
	apt-get "${aptopts[@]}" -qq update
	want=nng
	[ -n "$sysver" ] && want="nng=$sysver"
	if ! (cd "$work/src" && apt-get "${aptopts[@]}" -qq source --download-only "$want"); then
		[ "$want" = nng ] && exit 1
		say "no source of $want: taking the newest nng"
		(cd "$work/src" && apt-get "${aptopts[@]}" -qq source --download-only nng)
	fi
}

mkdir -p "$work"
fetch_source
dsc=$(ls "$work"/src/nng_*.dsc | head -1)
key=$( { sha256sum "$dsc" "${patches[@]}" | awk '{print $1}'; printf '%s\n' "${opts[@]}"; } | sha256sum | cut -c1-16)
stamp=$prefix/.moat-nng-build
if [ "$force" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] &&
	[ -f "$prefix/lib/cmake/nng/nng-config.cmake" ]; then
	say "up to date in $prefix ($(basename "$dsc"), key $key)"
	exit 0
fi

t0=$(date +%s)
src=$work/nng-src
rm -rf "$src" "$work/build"
say "unpacking $(basename "$dsc") with Debian's patches"
# The files' checksums are checked against the .dsc (which apt checked
# against the mirror's signed index); its own signature needs a keyring
# this host may lack, hence the log.
dpkg-source -x "$dsc" "$src" >"$work/unpack.log" 2>&1 ||
	{ cat "$work/unpack.log" >&2; exit 1; }
rm -f "$work"/nng_*.orig.tar.*  # dpkg-source's copy next to the tree
for p in "${patches[@]}"; do
	say "applying $(basename "$p")"
	patch -d "$src" -p1 --no-backup-if-mismatch -s <"$p"
done
say "building (-j$jobs)"
cmake -S "$src" -B "$work/build" -DCMAKE_INSTALL_PREFIX="$prefix" "${opts[@]}" >"$work/configure.log" 2>&1 ||
	{ tail -30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j"$jobs" >"$work/build.log" 2>&1 ||
	{ tail -30 "$work/build.log" >&2; exit 1; }
rm -rf "$prefix"
cmake --install "$work/build" >/dev/null
echo "$key" >"$stamp"
rm -rf "$src" "$work/build"
say "installed in $prefix ($(basename "$dsc") + ${#patches[@]} patch(es), $(( $(date +%s) - t0 ))s)"
