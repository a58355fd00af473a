#!/usr/bin/env bash
# deploy_systemd: the units of deploy/systemd, made from their .in files
# as cmake/install.cmake makes them (configure_file @ONLY with
# MOAT_BINDIR and MOAT_DATADIR) into a temporary directory, then read by
# systemd itself: `systemd-analyze verify` must print nothing for every
# unit, and `systemd-analyze security --offline` must rate the control
# services' sandboxing at most 2.5 (vmd, which needs root for its VMMs,
# at most 7.5). Also checks what the cluster relies on: sockets under
# /run/moat kept across restarts, state under /var/lib/moat.
# ExecStart must name a program that exists: the build tree's binaries
# when MOAT_BIN_DIR has them, else stand-in scripts. Exit 77 without
# systemd-analyze or cmake.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
units=(vmd gateway sessiond snapd)
command -v systemd-analyze >/dev/null ||
	{ echo "SKIP - systemd-analyze is not installed (Debian: systemd)"; exit 77; }
command -v cmake >/dev/null || { echo "SKIP - cmake is not installed"; exit 77; }

work=$(mktemp -d /tmp/moat-systemd-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0
ok() { echo "ok - $*"; }
fail() { echo "FAIL - $*"; fails=$((fails + 1)); }

bindir=${MOAT_BIN_DIR:-}
for u in "${units[@]}"; do
	[ -n "$bindir" ] && [ -x "$bindir/moat-$u" ] && continue
	bindir=$work/bin
	break
done
if [ "$bindir" = "$work/bin" ]; then
	mkdir -p "$bindir"
	for u in "${units[@]}"; do
		printf '#!/bin/sh\nexit 0\n' >"$bindir/moat-$u"
		chmod +x "$bindir/moat-$u"
	done
	echo "# ExecStart points at stand-ins in $bindir (no built binaries in MOAT_BIN_DIR)"
fi

# The same configure_file call as cmake/install.cmake's install(CODE).
cat >"$work/configure.cmake" <<'EOF'
configure_file("${IN}" "${OUT}" @ONLY)
EOF
for u in "${units[@]}"; do
	in=$repo/deploy/systemd/moat-$u.service.in
	out=$work/moat-$u.service
	if ! cmake -DIN="$in" -DOUT="$out" -DMOAT_BINDIR="$bindir" \
		-DMOAT_DATADIR=/usr/share -P "$work/configure.cmake"; then
		fail "moat-$u.service.in does not configure"
		continue
	fi
	if grep -n '@[A-Za-z_]*@' "$out"; then
		fail "moat-$u.service keeps a @VAR@ that install.cmake does not set"
	fi
	grep -qx "ExecStart=$bindir/moat-$u" "$out" ||
		fail "moat-$u.service: ExecStart is not exactly \$MOAT_BINDIR/moat-$u (install_tree checks it)"
done

# systemd's reading: nothing at all on stdout or stderr.
cd "$work" || exit 1
for u in "${units[@]}"; do
	f=moat-$u.service
	[ -f "$f" ] || continue
	out=$(SYSTEMD_LOG_COLOR=0 systemd-analyze verify "$work/$f" 2>&1)
	rc=$?
	if [ $rc -eq 0 ] && [ -z "$out" ]; then
		ok "systemd-analyze verify $f prints nothing"
	else
		fail "systemd-analyze verify $f (exit $rc): $out"
	fi
done

# Sandboxing, as systemd rates it (0 best, 10 worst; threshold x10).
for u in "${units[@]}"; do
	f=moat-$u.service
	[ -f "$f" ] || continue
	limit=25
	[ "$u" = vmd ] && limit=75
	level=$(systemd-analyze security --offline=yes "$work/$f" 2>/dev/null |
		sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
	if systemd-analyze security --offline=yes --threshold=$limit "$work/$f" >/dev/null 2>&1; then
		ok "$f: exposure $level, at most $((limit / 10)).$((limit % 10))"
	else
		fail "$f: exposure ${level:-unknown} above $((limit / 10)).$((limit % 10))"
	fi
done

# What the cluster relies on.
for u in "${units[@]}"; do
	f=$work/moat-$u.service
	[ -f "$f" ] || continue
	for line in RuntimeDirectory=moat RuntimeDirectoryPreserve=yes StateDirectory=moat \
		ConfigurationDirectory=moat; do
		grep -qx "$line" "$f" || fail "moat-$u.service lacks $line"
	done
done
ok "every unit: RuntimeDirectory=moat (kept), StateDirectory=moat, ConfigurationDirectory=moat"
for u in gateway sessiond snapd; do
	f=$work/moat-$u.service
	for line in ProtectSystem=strict PrivateDevices=yes NoNewPrivileges=yes \
		MemoryDenyWriteExecute=yes SystemCallFilter=@system-service CapabilityBoundingSet=; do
		grep -qx "$line" "$f" || fail "moat-$u.service lacks $line"
	done
done
ok "gateway, sessiond, snapd: strict sandboxing, no capabilities"
grep -qx 'DeviceAllow=/dev/kvm rwm' "$work/moat-vmd.service" &&
	! grep -q '^PrivateDevices=yes' "$work/moat-vmd.service" &&
	ok "vmd reaches /dev/kvm" || fail "vmd cannot reach /dev/kvm"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all systemd unit checks passed"
