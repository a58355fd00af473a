#!/usr/bin/env bash
# Issue 17, items 1 and 2: custom images end to end. (a) The sample spec
# images/specs/datasci.ini (python3-numpy, git, an [env] default) builds
# into a temporary image directory; built again it is "up to date"
# (cached by its spec id, nothing rebuilt); its manifest lists every
# package with its version. (b) A root filesystem made here from the
# host (static busybox, python3 with the libraries ldd names and its
# standard library) becomes an image with --from-tar. Each is booted
# once by images/boot-check.sh (numpy, git, the env default; python3
# prints 42). Then a stack on
# that image directory (the default image linked in) runs numpy
# (prints 3), git --version and env (the spec's default is there) in the
# spec's image and python3 in the tarball's (prints 42). The first build
# downloads packages (minutes); no timing decides a result. 77 (skipped)
# when not root, without mmdebstrap or a default image.
set -uo pipefail
repo=${MOAT_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
bin=${MOAT_BIN_DIR:-$repo/build/bin}
default_img=${MOAT_IMAGE_DIR:-$repo/images/out}/default
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "building images needs root"
command -v mmdebstrap >/dev/null || skip "no mmdebstrap (deploy/install-deps.sh)"
[ -f "$default_img/rootfs.ext4" ] || skip "no default image in $default_img (images/build.sh)"
[ -x "$bin/moat-image-spec" ] || skip "no $bin/moat-image-spec: build first"

state=$(mktemp -d /tmp/moat-images-state.XXXXXX)
work=$(mktemp -d /tmp/moat-images-work.XXXXXX)
out=$work/images # the stack's image directory
mkdir -p "$out" && chmod 0755 "$work" "$out"
export MOAT_STATE_DIR=$state MOAT_BIN_DIR=$bin MOAT_IMAGE_DIR=$out
export MOAT_GATEWAY=ipc://$state/gateway.sock
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MOAT_GATEWAY_HTTP=127.0.0.1:$port
moat=$bin/moat
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
bad() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() {
	local d=$1; shift
	if "$@"; then ok "$d"; else bad "$d"; fi
}
cleanup() {
	bash "$repo/deploy/moat-stack" stop >/dev/null 2>&1
	pkill -KILL -f "$state" 2>/dev/null
	bash "$repo/deploy/moat-stack" purge >/dev/null 2>&1
	rm -rf "$state" "$work"
}
trap cleanup EXIT
build() { bash "$repo/images/build.sh" --agent "$bin/moat-agent" --out "$out" "$@"; }
# manifest_has IMAGE PYTHON-EXPR: the expression over manifest m is true.
manifest_has() {
	python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
sys.exit(0 if eval(sys.argv[2]) else 1)' "$out/$1/manifest.json" "$2"
}

# --- (a) a spec ---------------------------------------------------------
spec=$repo/images/specs/datasci.ini
if build --spec "$spec" > "$work/build1.log" 2>&1; then
	ok "the datasci spec builds"
else
	bad "the datasci spec builds"; tail -n 20 "$work/build1.log"
fi
build --spec "$spec" > "$work/build2.log" 2>&1
check "built again, it is up to date" grep -q "image datasci is up to date" "$work/build2.log"
check "the manifest lists numpy and git with versions" manifest_has datasci \
	'any(p.startswith("python3-numpy=1") for p in m["installed_packages"]) and any(p.startswith("git=") for p in m["installed_packages"])'
check "the manifest names the source, spec id, env and languages" manifest_has datasci \
	'm["source"] == "spec:datasci" and len(m["spec_id"]) == 64 and m["env"]["MOAT_IMAGE_FLAVOUR"] == "datasci" and m["languages"] == ["python", "bash", "sh"]'

# --- (b) a root filesystem tarball made from the host ----------------------
root=$work/root
py=$(readlink -f /usr/bin/python3)
stdlib=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
mkdir -p "$root"/{bin,usr/bin,etc,tmp,root}
cp /bin/busybox "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
cp "$py" "$root/usr/bin/python3"
mkdir -p "$root$stdlib"
tar -C "$stdlib" --exclude=test --exclude=__pycache__ --exclude=idlelib \
	--exclude=tkinter --exclude=site-packages --exclude=dist-packages -cf - . |
	tar -C "$root$stdlib" -xf -
# Every library python3 and its extension modules load, at its path.
for lib in $( { ldd "$py"; find "$root$stdlib" -name '*.so' -exec ldd {} \; ; } 2>/dev/null |
	awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u); do
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done
tar -C "$root" -czf "$work/pyroot.tar.gz" .
if build --from-tar "$work/pyroot.tar.gz" > "$work/build3.log" 2>&1; then
	ok "the host-made tarball becomes image pyroot"
else
	bad "the host-made tarball becomes image pyroot"; tail -n 20 "$work/build3.log"
fi
check "its manifest says tar and python" manifest_has pyroot \
	'm["source"] == "tar:pyroot.tar.gz" and "python" in m["languages"] and m["installed_packages"] == []'

# --- each image booted once, no stack (images/boot-check.sh) ---------------
bootcheck() { # bootcheck DESCRIPTION IMAGE ARGS...
	local d=$1 img=$2; shift 2
	if bash "$repo/images/boot-check.sh" "$out/$img" --timeout 300 "$@" \
		> "$work/boot.log" 2>&1; then ok "$d"; else
		bad "$d"; tail -n 15 "$work/boot.log"; fi
}
bootcheck "a VM of the spec's image: numpy, git, the [env] default" datasci \
	--run 'python3 -c "import numpy; print(numpy.arange(3).sum())"; git --version | cut -c1-11; echo "$MOAT_IMAGE_FLAVOUR"' \
	--expect "$(printf '3\ngit version\ndatasci')"
bootcheck "a VM of the tarball's image runs python3 (42)" pyroot

# --- sandboxes of both through the stack -----------------------------------
ln -s "$(readlink -f "$default_img")" "$out/default"
if ! bash "$repo/deploy/moat-stack" start; then
	bad "stack starts"
	tail -n 30 "$state"/logs/*.log
	exit 1
fi
run_is() { # run_is DESCRIPTION WANT ARGS...: moat run's stdout is WANT
	local d=$1 want=$2 got; shift 2
	got=$("$moat" run "$@" 2>"$work/err")
	if [ "$got" = "$want" ]; then ok "$d"; else
		bad "$d: got \"$got\", want \"$want\""; cat "$work/err"; fi
}
run_is "numpy in the spec's image" 3 --image datasci \
	-c 'import numpy; print(numpy.arange(3).sum())'
got=$("$moat" run --image datasci -l sh -c 'git --version' 2>"$work/err")
check "git --version in the spec's image ($got)" grep -q '^git version' <<< "$got"
got=$("$moat" run --image datasci -l sh -c env 2>"$work/err")
check "the spec's [env] default is in env" grep -qx 'MOAT_IMAGE_FLAVOUR=datasci' <<< "$got"
run_is "python3 in the tarball's image" 42 --image pyroot -c 'print(6*7)'
run_is "the default image still runs" 42 -c 'print(6*7)'

echo "passed $passed, failed $failed"
[ "$failed" = 0 ]
