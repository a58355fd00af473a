#!/usr/bin/env bash
# deb_test.sh: `cpack -G DEB` of the build tree into a temporary folder;
# checks that moat-node, moat-control and moat-client each hold what they
# should and nothing of the others (dpkg-deb --contents), and that each
# declares its dependencies (dpkg-deb -f Depends).
# usage: deb_test.sh BUILD_DIR LIBDIR (LIBDIR: relative, as GNUInstallDirs
# chose it). Not for: the install tree itself (install_test.sh).
set -uo pipefail
build=$1
libdir=$2
work=$(mktemp -d /tmp/moat-deb-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
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

# The tree is built (ctest runs after make). With the Makefiles
# generator cpack first makes the "preinstall" target, a pass over every
# target of the tree that costs ~15 s here and builds nothing; naming
# another generator skips only that pass: the install scripts and what
# they install are the same.
if ! (cd "$build" && cpack -G DEB -B "$work/out" -D CPACK_CMAKE_GENERATOR=Ninja) >"$work/cpack.log" 2>&1; then
	cat "$work/cpack.log"
	echo "FAIL - cpack -G DEB in $build"
	exit 1
fi

node_has="usr/bin/moat-vmd usr/bin/moat-image-build usr/libexec/moat/moat-agent
usr/libexec/moat/moat-image-spec
usr/libexec/moat/images/build.sh usr/libexec/moat/images/boot-check.sh
usr/lib/systemd/system/moat-vmd.service"
control_has="usr/bin/moat-gateway usr/bin/moat-sessiond usr/bin/moat-snapd
usr/lib/systemd/system/moat-gateway.service
usr/lib/systemd/system/moat-sessiond.service
usr/lib/systemd/system/moat-snapd.service usr/share/moat/moat.conf.example"
client_has="usr/bin/moat usr/$libdir/libmoat.so.0 usr/$libdir/libmoat.so
usr/include/moat/moat_client.h usr/include/moat/moat/status.h
usr/include/moat/gateway.pb-c.h usr/$libdir/pkgconfig/moat.pc
usr/share/moat/python/pyproject.toml usr/share/moat/python/moat/__init__.py"

for pkg in node control client; do
	deb=$(ls "$work/out"/moat-"$pkg"_*.deb 2>/dev/null | head -1)
	if [ -z "$deb" ]; then
		failed=$((failed + 1))
		echo "FAIL - no moat-$pkg .deb in $work/out"
		continue
	fi
	dpkg-deb --contents "$deb" | awk '{print $6}' | sed 's|^\./||' |
		sed 's|/$||' >"$work/$pkg.files"
	dpkg-deb -f "$deb" Depends >"$work/$pkg.depends"
	check "moat-$pkg is named moat-$pkg" \
		test "$(dpkg-deb -f "$deb" Package)" = "moat-$pkg"
	for other in node control client; do
		eval "list=\$${other}_has"
		for f in $list; do
			if [ "$other" = "$pkg" ]; then
				check "moat-$pkg holds $f" grep -qx "$f" "$work/$pkg.files"
			else
				check "moat-$pkg does not hold $f (moat-$other's)" \
					sh -c "! grep -qx '$f' '$work/$pkg.files'"
			fi
		done
	done
	check "moat-$pkg holds no test binary" \
		sh -c "! grep -qE '(^|/)(test_|fuzz_|moat-bench)' '$work/$pkg.files'"
	check "moat-$pkg declares libc6 (shlibdeps ran)" grep -q 'libc6' "$work/$pkg.depends"
done
check "moat-node depends on qemu-system-x86" grep -q 'qemu-system-x86' "$work/node.depends"
check "moat-control depends on liblmdb0" grep -q 'liblmdb0' "$work/control.depends"
# nng: Debian's libnng1, or (deploy/build-nng.sh's static nng, linked
# into the binaries) the mbedtls it uses.
check "moat-control depends on nng's libraries" grep -qE 'libnng1|libmbedtls' "$work/control.depends"
check "moat-client depends on libprotobuf-c1" grep -q 'libprotobuf-c1' "$work/client.depends"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
