#!/usr/bin/env bash
# Issue 17, item 5: `moat cp -r` through the local stack (real VM): a
# tree of 1,000 small files in nested directories, an empty directory, a
# symlink and a 20 MB file goes in and comes out again; every file's
# sha256 matches on both sides and the symlink is still a link with its
# target. Copying into an existing directory keeps the source's name;
# without -r a directory is refused saying to use -r. Archives made with
# Python's tarfile and sent as they are (`moat cp --tar`) holding "../x",
# a device node, or a file under an earlier symlink are refused with a
# clear error, and nothing was written in the guest (`moat exec ... ls`).
# 77 (skipped) without a guest image, or when the image's agent predates
# the archive ops (rebuild: images/build.sh --agent build/bin/moat-agent).
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
export MOAT_IMAGE_DIR=${MOAT_IMAGE_DIR:-$repo/images/out}
if [ ! -f "$MOAT_IMAGE_DIR/default/rootfs.ext4" ]; then
	echo "SKIP: no guest image in $MOAT_IMAGE_DIR (images/build.sh)"
	exit 77
fi
state=$(mktemp -d /tmp/moat-cpdir-test.XXXXXX)
work=$(mktemp -d /tmp/moat-cpdir-work.XXXXXX)
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin
export MOAT_GATEWAY=ipc://$state/gateway.sock
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_GATEWAY_HTTP=127.0.0.1:$port
moat=$bin/moat
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() {
	local d=$1
	shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT

# sums DIR: "sha256  ./path" of every regular file, sorted by path.
sums() { (cd "$1" && find . -type f -exec sha256sum {} +) | LC_ALL=C sort -k2; }

python3 - "$work/tree" <<'EOF'
import os, sys
top = sys.argv[1]
for i in range(1000):
    d = os.path.join(top, "d%d" % (i % 10), "e%d" % (i // 10 % 10))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%d.txt" % i), "w") as f:
        f.write(("file %d\n" % i) * (i % 7 + 1))
os.symlink("d0/e0/f0.txt", os.path.join(top, "link"))
os.makedirs(os.path.join(top, "empty"))
with open(os.path.join(top, "big.bin"), "wb") as f:
    f.write(os.urandom(20 << 20))
EOF
python3 - "$work" <<'EOF'
import io, sys, tarfile
w = sys.argv[1]
with tarfile.open(w + "/dotdot.tar", "w") as t:
    t.addfile(tarfile.TarInfo("ok.txt"), io.BytesIO(b""))
    t.addfile(tarfile.TarInfo("../x"), io.BytesIO(b""))
with tarfile.open(w + "/dev.tar", "w") as t:
    i = tarfile.TarInfo("null")
    i.type, i.devmajor, i.devminor = tarfile.CHRTYPE, 1, 3
    t.addfile(i)
with tarfile.open(w + "/link.tar", "w") as t:
    i = tarfile.TarInfo("etc")
    i.type, i.linkname = tarfile.SYMTYPE, "/etc"
    t.addfile(i)
    t.addfile(tarfile.TarInfo("etc/moat-owned"), io.BytesIO(b""))
EOF

if ! bash "$repo/deploy/moat-stack" start; then
	bad "stack starts"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
sb=$("$moat" sandbox create 2>"$work/err")
check "a sandbox ($sb)" [ -n "$sb" ]

"$moat" cp -r "$work/tree" "$sb:/root/in" >"$work/up" 2>"$work/err"
rc=$?
if grep -q "not known to moat-agent" "$work/err"; then
	echo "SKIP: the image's agent has no archive ops: rebuild it" \
		"(images/build.sh --agent build/bin/moat-agent --out DIR) and set MOAT_IMAGE_DIR"
	exit 77
fi
check "cp -r into the sandbox exits 0" [ "$rc" = 0 ]
cat "$work/up" "$work/err"
check "the summary counts 1001 files and 1 symlink" \
	grep -q "1001 files, .* 1 symlinks" "$work/up"
sums "$work/tree" >"$work/sums.local"
# Into a guest file, then out with plain `moat cp`: a thousand lines of
# exec output would test exec's streaming, not this.
"$moat" exec "$sb" -- sh -c \
	'cd /root/in && find . -type f -exec sha256sum {} + >/tmp/sums' \
	2>>"$work/err"
check "sha256sum ran in the guest" [ $? = 0 ]
"$moat" cp "$sb:/tmp/sums" "$work/sums.raw" 2>>"$work/err"
LC_ALL=C sort -k2 "$work/sums.raw" >"$work/sums.guest"
check "every file's sha256 matches in the guest (1001 files)" \
	cmp -s "$work/sums.local" "$work/sums.guest"
check "1001 sums were compared" [ "$(wc -l <"$work/sums.guest")" = 1001 ]
cmp -s "$work/sums.local" "$work/sums.guest" ||
	diff "$work/sums.local" "$work/sums.guest" | head -n 5
check "the symlink is a link in the guest, same target" \
	[ "$("$moat" exec "$sb" -- readlink /root/in/link)" = d0/e0/f0.txt ]
check "the empty directory came too" \
	"$moat" exec "$sb" -- test -d /root/in/empty

"$moat" cp -r "$sb:/root/in" "$work/out" >"$work/down" 2>>"$work/err"
check "cp -r out of the sandbox exits 0" [ $? = 0 ]
cat "$work/down"
sums "$work/out" >"$work/sums.out"
check "every file's sha256 matches after the way back" \
	cmp -s "$work/sums.local" "$work/sums.out"
check "the symlink came back as a link" \
	[ "$(readlink "$work/out/link")" = d0/e0/f0.txt ]

"$moat" cp -r "$work/tree" "$sb:/root/in" >/dev/null 2>>"$work/err"
check "into an existing directory the source keeps its name" \
	"$moat" exec "$sb" -- test -f /root/in/tree/big.bin
mkdir "$work/into"
"$moat" cp -r "$sb:/root/in/d3" "$work/into" >/dev/null 2>>"$work/err"
check "out into an existing directory too" [ -f "$work/into/d3/e0/f3.txt" ]
"$moat" cp "$work/tree" "$sb:/root/plain" >/dev/null 2>"$work/err.plain"
check "without -r a directory is refused, saying -r" \
	grep -q -- "-r" "$work/err.plain"

# refused: tarfile's archives, sent raw
for t in dotdot:'"\.\./x"' dev:'device node' link:'earlier member made a symlink'; do
	name=${t%%:*}
	want=${t#*:}
	"$moat" cp --tar "$work/$name.tar" "$sb:/root/t-$name" \
		>/dev/null 2>"$work/err.$name"
	rc=$?
	cat "$work/err.$name"
	check "$name.tar is refused" [ "$rc" != 0 ]
	check "$name.tar: the error says why" grep -q "$want" "$work/err.$name"
	out=$("$moat" exec "$sb" -- sh -c "ls -d /root/t-$name /root/x /x /etc/moat-owned 2>/dev/null")
	check "$name.tar: nothing was written in the guest" [ -z "$out" ]
done

echo "passed $passed, failed $failed"
if [ "$failed" != 0 ]; then
	tail -n 20 "$state"/logs/vmd.log
	exit 1
fi
exit 0
