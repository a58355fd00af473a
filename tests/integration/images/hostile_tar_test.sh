#!/usr/bin/env bash
# Issue 17, item 2: a hostile root filesystem tarball, made here with
# python3's tarfile: a device node, a setuid file, an absolute symlink
# usr/sbin -> a host directory this test makes, a symlink etc/x that
# climbs to ../../../../etc/passwd, and a ../escape member.
# images/build.sh --from-tar refuses the ".." member with a clear error
# and builds nothing; without it the build succeeds, nothing is written
# into the host directory (the agent goes in through no symlink), the
# image holds no device node and no setuid bit, and the manifest's
# "changes" lists each change. Not a tarball, an empty one, one without
# /bin/sh and a bzip2 one are refused, each with its reason. No VM. 77
# (skipped) when not root.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
[ "$(id -u)" = 0 ] || { echo "SKIP: building images needs root"; exit 77; }
work=$(mktemp -d /tmp/moat-hostile-tar.XXXXXX)
hostdir=$(mktemp -d /tmp/moat-hostile-host.XXXXXX)
out=$work/images
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() {
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
trap 'rm -rf "$work" "$hostdir"' EXIT

# make_tar FILE ESCAPE(0|1)
make_tar() {
	python3 - "$1" "$hostdir" "$2" <<'PY'
import io, sys, tarfile
out, hostdir, escape = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def add(t, name, kind=tarfile.REGTYPE, data=b"", mode=0o644, link="", dev=(0, 0)):
    i = tarfile.TarInfo(name)
    i.type, i.mode, i.linkname = kind, mode, link
    i.devmajor, i.devminor = dev
    i.size = len(data) if kind == tarfile.REGTYPE else 0
    t.addfile(i, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
with tarfile.open(out, "w:gz") as t:
    for d in ["bin", "usr", "etc", "dev"]:
        add(t, d, tarfile.DIRTYPE, mode=0o755)
    add(t, "bin/busybox", data=open("/bin/busybox", "rb").read(), mode=0o755)
    add(t, "bin/sh", tarfile.SYMTYPE, link="busybox")
    add(t, "dev/null", tarfile.CHRTYPE, mode=0o666, dev=(1, 3))
    add(t, "bin/su", data=b"#!/bin/sh\n", mode=0o4755)
    add(t, "usr/sbin", tarfile.SYMTYPE, link=hostdir)
    add(t, "etc/x", tarfile.SYMTYPE, link="../../../../etc/passwd")
    if escape:
        add(t, "../escape", data=b"out\n")
PY
}
build() { bash "$repo/images/build.sh" --agent "$bin/moat-agent" --out "$out" "$@"; }

make_tar "$work/bad.tar.gz" 1
build --from-tar "$work/bad.tar.gz" --name bad > "$work/bad.log" 2>&1
check "the ../escape member is refused" [ $? != 0 ]
check "the error names it and says what to do" \
	grep -q 'member "../escape" has a ".." component.*remove it from the tarball' "$work/bad.log"
check "no image was made" [ ! -e "$out/bad" ]
check "nothing landed beside the work dir" [ ! -e "$work/escape" ]

# refused_with NAME TEXT: building tarball $work/NAME fails, saying TEXT.
refused_with() {
	if build --from-tar "$work/$1" --name refused > "$work/r.log" 2>&1; then
		bad "$1 is refused"
	else
		check "$1 is refused: $2" grep -q "$2" "$work/r.log"
	fi
}
echo "just text" > "$work/text.tar"
refused_with text.tar "is not a tarball"
tar -cf "$work/empty.tar" -T /dev/null
refused_with empty.tar "is an empty tarball"
gzip -c "$work/empty.tar" > "$work/empty.tar.gz"
refused_with empty.tar.gz "is an empty tarball"
mkdir -p "$work/nosh/etc" && echo moat > "$work/nosh/etc/hostname"
tar -C "$work/nosh" -cf "$work/nosh.tar" .
refused_with nosh.tar "has no /bin/sh: the sandbox runs commands through /bin/sh"
if command -v bzip2 >/dev/null; then
	bzip2 -c "$work/nosh.tar" > "$work/nosh.tar.bz2"
	refused_with nosh.tar.bz2 "compressed in a way build.sh does not read"
fi
check "no refused image was made" [ ! -e "$out/refused" ]

make_tar "$work/hostile.tar.gz" 0
if build --from-tar "$work/hostile.tar.gz" > "$work/ok.log" 2>&1; then
	ok "without it the tarball builds (name from the file)"
else
	bad "without it the tarball builds"; tail -n 20 "$work/ok.log"
fi
check "nothing was written into the host directory" \
	[ -z "$(ls -A "$hostdir")" ]
py_check() {
	python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
c = "\n".join(m["changes"])
sys.exit(0 if eval(sys.argv[2]) else 1)' "$out/hostile/manifest.json" "$1"
}
check "changes: the device node removed" py_check '"removed character device /dev/null" in m["changes"]'
check "changes: the setuid bit cleared" py_check '"cleared setuid/setgid on /bin/su (4755 -> 755)" in m["changes"]'
check "changes: the absolute symlink made relative" \
	py_check '"symlink /usr/sbin -> '"$hostdir"' rewritten to ..'"$hostdir"' (inside the image)" in m["changes"]'
check "changes: the climbing symlink kept inside" \
	py_check '"symlink /etc/x -> ../../../../etc/passwd rewritten to passwd (inside the image)" in m["changes"]'
check "the manifest says where it came from" py_check 'm["source"] == "tar:hostile.tar.gz"'
img=$out/hostile/rootfs.ext4
check "the image has no /dev/null" bash -c "! debugfs -R 'stat /dev/null' '$img' 2>&1 | grep -q 'Type: character'"
check "the image's /bin/su is 0755" bash -c "debugfs -R 'stat /bin/su' '$img' 2>/dev/null | grep -q 'Mode:  0755'"
check "the agent is in the image" bash -c "debugfs -R 'stat /usr/sbin/moat-agent' '$img' 2>/dev/null | grep -q 'Type: regular'"

echo "passed $passed, failed $failed"
[ "$failed" = 0 ]
