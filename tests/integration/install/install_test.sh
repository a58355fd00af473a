#!/usr/bin/env bash
# install_test.sh: `cmake --install` of the build tree into a temporary
# prefix; checks that every file of every component is there (binaries,
# agent, image builder, libmoat with its SONAME and only the client API
# exported, headers, moat.pc, Python SDK, systemd units naming that
# prefix, example config), then builds client_smoke.c against the
# installed library with `pkg-config --cflags --libs moat` and runs it.
# usage: install_test.sh BUILD_DIR SRC_DIR LIBDIR [CFLAGS] (LIBDIR:
# relative, as GNUInstallDirs chose it; CFLAGS: extra flags for the
# program, the sanitizers of a MOAT_SANITIZE build). Not for: the .deb
# packages (deb_test.sh).
set -uo pipefail
build=$1
src=$2
libdir=$3
extra_cflags=${4:-}
work=$(mktemp -d /tmp/moat-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/usr
passed=0
failed=0

check() {
	local what=$1
	shift
	if "$@" >/dev/null 2>&1; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		echo "FAIL - $what"
	fi
}

if ! cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1; then
	cat "$work/install.log"
	echo "FAIL - cmake --install $build --prefix $prefix"
	exit 1
fi

for f in bin/moat-vmd bin/moat-gateway bin/moat-sessiond bin/moat-snapd \
	bin/moat bin/moat-image-build libexec/moat/moat-agent \
	libexec/moat/moat-image-spec \
	libexec/moat/images/build.sh libexec/moat/images/boot-check.sh; do
	check "$f is installed and executable" test -x "$prefix/$f"
done
for f in "$libdir/libmoat.so" "$libdir/libmoat.so.0" \
	"$libdir/pkgconfig/moat.pc" include/moat/moat_client.h \
	include/moat/moat/status.h include/moat/common.pb-c.h \
	include/moat/gateway.pb-c.h include/moat/session.pb-c.h \
	include/moat/vm.pb-c.h share/moat/moat.conf.example \
	share/moat/python/pyproject.toml share/moat/python/moat/__init__.py \
	share/moat/python/moat/client.py; do
	check "$f is installed" test -e "$prefix/$f"
done
for u in vmd gateway sessiond snapd; do
	unit=$prefix/lib/systemd/system/moat-$u.service
	check "moat-$u.service is installed" test -f "$unit"
	check "moat-$u.service runs $prefix/bin/moat-$u" \
		grep -qx "ExecStart=$prefix/bin/moat-$u" "$unit"
done
# systemd's own reading of the units, where it is installed.
if command -v systemd-analyze >/dev/null; then
	for u in vmd gateway sessiond snapd; do
		check "systemd-analyze verify moat-$u.service" \
			systemd-analyze verify "$prefix/lib/systemd/system/moat-$u.service"
	done
fi
check "no Python bytecode is installed" \
	sh -c "! find '$prefix/share/moat/python' -name '__pycache__' | grep -q ."

lib=$prefix/$libdir/libmoat.so.0
check "libmoat's SONAME is libmoat.so.0" \
	sh -c "readelf -d '$lib' | grep -q 'Library soname: \[libmoat.so.0\]'"
# Exported: the client API, status strings and the moat.v1 messages only.
nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' |
	grep -vE '^(moat_client_|moat_strerror$|moat_status_|moat__v1__|MOAT_0$)' \
	>"$work/extra-symbols"
check "libmoat exports only the client API (extra: $(head -5 "$work/extra-symbols" | tr '\n' ' '))" \
	test ! -s "$work/extra-symbols"
check "libmoat exports moat_client_open" \
	sh -c "nm -D --defined-only '$lib' | grep -q ' moat_client_open'"

check "installed moat-vmd runs (--version)" "$prefix/bin/moat-vmd" --version
check "installed moat runs (help)" "$prefix/bin/moat" help
check "moat-image-build finds the installed build.sh (--help)" \
	"$prefix/bin/moat-image-build" --help
check "the installed Python SDK imports" \
	env PYTHONPATH="$prefix/share/moat/python" PYTHONDONTWRITEBYTECODE=1 \
	python3 -c 'import moat'

# A program of someone else's, built only from what was installed.
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
if flags=$(pkg-config --cflags --libs moat 2>"$work/pc.err"); then
	passed=$((passed + 1))
	# shellcheck disable=SC2086
	if cc -std=c11 -Wall -Werror $extra_cflags -o "$work/client_smoke" \
		"$src/tests/integration/install/client_smoke.c" $flags \
		-Wl,-rpath,"$prefix/$libdir" 2>"$work/cc.err"; then
		passed=$((passed + 1))
		check "client_smoke links the installed libmoat" \
			sh -c "ldd '$work/client_smoke' | grep -q '$prefix/$libdir/libmoat.so.0'"
		if "$work/client_smoke"; then
			passed=$((passed + 1))
		else
			failed=$((failed + 1))
			echo "FAIL - client_smoke, built against the installed libmoat, failed"
		fi
	else
		failed=$((failed + 1))
		echo "FAIL - client_smoke does not build with: $flags"
		cat "$work/cc.err"
	fi
else
	failed=$((failed + 1))
	echo "FAIL - pkg-config --cflags --libs moat (PKG_CONFIG_PATH=$PKG_CONFIG_PATH)"
	cat "$work/pc.err"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
