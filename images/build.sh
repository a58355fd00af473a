#!/bin/bash
# images/build.sh: builds a moat guest image (kernel, initramfs, read-only
# root filesystem, manifest) from Debian packages, without mounting
# anything. The expensive part (kernel package, modules, mmdebstrap) is
# cached under ${MOAT_CACHE_DIR:-/var/cache/moat}/images/<key>/, keyed by
# this script, the kernel package version, the suite and the package list,
# so a new moat-agent only re-runs the cheap steps (cpio + mkfs, ~1 s).
# Not for: starting VMs (moat-vmd does that; images/boot-check.sh boots an
# image once to check it), or making scratch disks (vmd makes those).
#
# usage: images/build.sh [--agent PATH] [--out DIR] [--name NAME] [--check] [--force]
# Output: OUT/NAME/{vmlinuz, vmlinux, initrd.img, rootfs.ext4,
# manifest.json}. Needs root (mmdebstrap), apt lists (apt-get update),
# and mmdebstrap, e2fsprogs, cpio, kmod, gzip; lz4/xz/zstd for vmlinux.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/.." && pwd)
agent=$repo/build/bin/moat-agent
out=$repo/images/out
name=default
check=0
suite=${MOAT_IMAGE_SUITE:-bookworm}
kernel_meta=linux-image-cloud-amd64
packages=python3,busybox,nodejs
# Loaded by the agent in this order after dependencies are put first.
# virtio_pci is left out: microvm and Firecracker only have virtio-mmio;
# virtio_rng too: the guest seeds from RDRAND (crng is ready at 0 s).
wanted_modules=(virtio_mmio virtio_blk virtio_console overlay
	vmw_vsock_virtio_transport)
cache_root=${MOAT_CACHE_DIR:-/var/cache/moat}/images
force=0
started=${EPOCHREALTIME/./}

log() {
	local ms=$(( (${EPOCHREALTIME/./} - started) / 1000 ))
	printf 'images: [%d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*" >&2
}
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

usage() {
	sed -n 's/^# usage: /usage: /p' "${BASH_SOURCE[0]}"
	exit "${1:-0}"
}

while [ $# -gt 0 ]; do
	case $1 in
	--agent) agent=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--name) name=$2; shift 2 ;;
	--check) check=1; shift ;;
	--force) force=1; shift ;;
	-h|--help) usage 0 ;;
	*) echo "images: unknown argument: $1" >&2; usage 2 ;;
	esac
done

case $name in
''|*[!A-Za-z0-9._-]*|.*) die "image name \"$name\" must be letters, digits, . _ - (not starting with .)" ;;
esac
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, device nodes in the rootfs): run it with sudo"
[ -f "$agent" ] || die "no agent binary at $agent: build it first (make -C build moat-agent) or pass --agent PATH"
# A dynamic binary names its loader; the initramfs has no libc.
! LC_ALL=C grep -q '/lib64/ld-linux' "$agent" ||
	die "$agent is not a static binary: the initramfs has no libc"
for tool in mmdebstrap mkfs.ext4 cpio depmod gzip dpkg-deb apt-get apt-cache sha256sum flock; do
	command -v "$tool" >/dev/null || die "$tool is missing: apt-get install mmdebstrap e2fsprogs cpio kmod gzip"
done

# --- what to build: kernel package version and the cache key -------------
# The metapackage pins the versioned one: "Depends: linux-image-R (= V)".
read -r kernel_pkg kernel_deb_version < <(apt-cache show --no-all-versions \
	"$kernel_meta" 2>/dev/null | sed -n \
	's/^Depends:.*\(linux-image-[^ ,]*\) (= \([^)]*\)).*/\1 \2/p' | head -n 1) || true
if [ -z "${kernel_pkg:-}" ] || [ -z "${kernel_deb_version:-}" ]; then
	die "apt does not know $kernel_meta: run apt-get update"
fi
kernel_release=${kernel_pkg#linux-image-}
key=$( { sha256sum < "${BASH_SOURCE[0]}"; echo "$kernel_pkg $kernel_deb_version";
	echo "$suite $packages ${wanted_modules[*]}"; } | sha256sum | cut -c1-16)
base=$cache_root/$key
log "kernel $kernel_pkg ($kernel_deb_version), suite $suite, cache key $key"

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9 # one build at a time: the cached rootfs gets this agent copied in

# Same script, kernel, packages and agent as the image already there: done.
inputs=$( { echo "$key"; sha256sum < "$agent"; } | sha256sum | cut -c1-64)
if [ "$force" = 0 ] && [ -f "$out/$name/manifest.json" ] &&
	[ -f "$out/$name/initrd.img" ] && [ -f "$out/$name/rootfs.ext4" ] &&
	[ -f "$out/$name/vmlinuz" ] && grep -q "\"inputs\": \"$inputs\"" "$out/$name/manifest.json"; then
	log "image $name is up to date in $out/$name (--force rebuilds it)"
	[ "$check" = 1 ] && exec "$script_dir/boot-check.sh" "$out/$name"
	exit 0
fi

rm -rf "$cache_root"/.work.* # left by a killed run; we hold the lock
work=$(mktemp -d "$cache_root/.work.XXXXXX")
stage=
cleanup() { rm -rf "$work" ${stage:+"$stage"}; }
trap cleanup EXIT

# --- kernel and modules ----------------------------------------------------
# extract_vmlinux BZIMAGE DEST: writes the ELF kernel packed inside a
# bzImage to DEST by trying each compressed stream's magic at each offset
# it occurs until one decompresses to an ELF file; fails if none does.
extract_vmlinux() {
	local image=$1 dest=$2 magic tool off
	for magic in '\x02\x21\x4c\x18:lz4 -dc' '\x28\xb5\x2f\xfd:zstd -dcq' \
		'\xfd\x37\x7a\x58\x5a\x00:xz -dcq' '\x1f\x8b\x08:gzip -dcq'; do
		tool=${magic#*:}
		command -v "${tool%% *}" >/dev/null || continue
		for off in $(LC_ALL=C grep -obUaP "${magic%%:*}" "$image" | cut -d: -f1); do
			tail -c +$((off + 1)) "$image" | $tool > "$dest" 2>/dev/null || true
			if [ "$(head -c 4 "$dest" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
				return 0
			fi
		done
	done
	rm -f "$dest"
	return 1
}

build_kernel() {
	local kdir=$1 debs=$cache_root/debs x=$work/kernel-pkg mods depfile
	local deb=$debs/${kernel_pkg}_${kernel_deb_version//:/%3a}_amd64.deb
	mkdir -p "$debs" "$kdir/modules"
	if [ ! -f "$deb" ]; then
		log "downloading $kernel_pkg $kernel_deb_version"
		(cd "$debs" && apt-get download -q "$kernel_pkg=$kernel_deb_version" 2>&1 |
			grep -v 'unsandboxed' >&2) || true
	fi
	[ -f "$deb" ] || die "apt-get download $kernel_pkg failed (is the mirror reachable?)"
	dpkg-deb -x "$deb" "$x"
	cp "$x/boot/vmlinuz-$kernel_release" "$kdir/vmlinuz"
	cp "$x/boot/config-$kernel_release" "$kdir/config"
	if extract_vmlinux "$kdir/vmlinuz" "$kdir/vmlinux"; then
		log "vmlinux (ELF) extracted"
	else
		log "warning: could not extract vmlinux (lz4/zstd/xz tools missing?): Firecracker needs it"
	fi
	mods=$x/lib/modules/$kernel_release
	[ -f "$mods/modules.dep" ] || depmod -b "$x" "$kernel_release"
	depfile=$mods/modules.dep

	# Dependency order: each module after everything it needs.
	declare -A done_mod=()
	local order=()
	visit() {
		local path=$1 dep
		[ -n "${done_mod[$path]:-}" ] && return
		done_mod[$path]=1
		for dep in $(awk -v m="$path:" '$1 == m { $1 = ""; print; exit }' "$depfile"); do
			visit "$dep"
		done
		order+=("$path")
	}
	# module name (dashes as underscores) -> path in modules.dep
	declare -A mod_path=()
	local m path
	while read -r m path; do
		mod_path[$m]=$path
	done < <(awk -F: '{ n = $1; sub(".*/", "", n); sub("[.]ko.*", "", n);
		gsub("-", "_", n); print n, $1 }' "$depfile")
	for m in "${wanted_modules[@]}"; do
		path=${mod_path[$m]:-}
		if [ -z "$path" ]; then
			if sed 's/-/_/g' "$mods/modules.builtin" | grep -q "/$m\.ko"; then
				log "module $m is built in"
				continue
			fi
			die "kernel $kernel_release has no module $m"
		fi
		visit "$path"
	done
	: > "$kdir/modules.order"
	local file base_name
	for path in "${order[@]}"; do
		file=$mods/$path
		base_name=$(basename "$path")
		case $base_name in
		*.ko.xz) xz -dc "$file" > "$kdir/modules/${base_name%.xz}"; base_name=${base_name%.xz} ;;
		*.ko.zst) zstd -dcq "$file" > "$kdir/modules/${base_name%.zst}"; base_name=${base_name%.zst} ;;
		*.ko.gz) gzip -dc "$file" > "$kdir/modules/${base_name%.gz}"; base_name=${base_name%.gz} ;;
		*) cp "$file" "$kdir/modules/$base_name" ;;
		esac
		echo "$base_name" >> "$kdir/modules.order"
	done
	echo "$kernel_release" > "$kdir/release"
	(cd "$kdir" && sha256sum vmlinuz vmlinux 2>/dev/null > sha256) || true
	log "modules: $(tr '\n' ' ' < "$kdir/modules.order")"
}

# --- root filesystem -------------------------------------------------------
build_rootfs() {
	local dir=$1 f mirrors=()
	# The mirror comes from the host's apt sources (mmdebstrap pastes a
	# file argument into the chroot's sources), never from this script.
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[ -s "$f" ] && grep -Eq '^[[:space:]]*(deb|Types:)' "$f" && mirrors+=("$f")
	done
	[ ${#mirrors[@]} -gt 0 ] || die "no apt sources on this host (/etc/apt/sources.list*)"
	log "mmdebstrap $suite (minbase + $packages), sources from ${mirrors[*]}"
	mmdebstrap --quiet --variant=minbase --include="$packages" \
		"$suite" "$dir" "${mirrors[@]}" ||
		die "mmdebstrap failed (see above)"
	rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/* \
		"$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* \
		"$dir"/usr/share/lintian "$dir"/var/log/*.log "$dir"/var/log/apt/* \
		"$dir"/var/cache/debconf/*-old "$dir"/var/lib/dpkg/*-old
	find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
	mkdir -p "$dir/root" && chmod 0700 "$dir/root"
	echo moat > "$dir/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\tmoat\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
		> "$dir/etc/hosts"
	log "rootfs: $(du -sh "$dir" | cut -f1)"
}

if [ ! -d "$base" ]; then
	log "no cached base: building kernel + rootfs (about a minute)"
	mkdir -p "$work/base"
	build_kernel "$work/base/kernel"
	build_rootfs "$work/base/rootfs"
	printf '{"kernel_package": "%s", "kernel_version": "%s", "suite": "%s", "packages": "%s"}\n' \
		"$kernel_pkg" "$kernel_deb_version" "$suite" "$packages" > "$work/base/info.json"
	mv "$work/base" "$base"
else
	log "cached base $base"
fi
touch "$base"
# Keep the three bases used last (other kernels, other versions of this
# script, other checkouts sharing the cache); drop older ones.
find "$cache_root" -mindepth 1 -maxdepth 1 -type d -regextype egrep \
	-regex '.*/[0-9a-f]{16}' -printf '%T@ %p\n' | sort -rn | tail -n +4 |
	cut -d' ' -f2- | xargs -r rm -rf
find "$cache_root/debs" -name '*.deb' -printf '%T@ %p\n' 2>/dev/null | sort -rn |
	tail -n +3 | cut -d' ' -f2- | xargs -r rm -f

# --- the cheap steps: initramfs, rootfs image ------------------------------
stage=$out/.$name.new
rm -rf "$stage"
mkdir -p "$stage"

initramfs=$work/initramfs
mkdir -p "$initramfs"/{dev,proc,sys,mnt/lower,mnt/scratch,newroot,tmp,lib/modules,etc/moat}
install -m 0755 "$agent" "$initramfs/init"
cp "$base"/kernel/modules/*.ko "$initramfs/lib/modules/" 2>/dev/null || true
cp "$base/kernel/modules.order" "$initramfs/etc/moat/modules"
(cd "$initramfs" && find . -mindepth 1 | LC_ALL=C sort |
	cpio --quiet -o -H newc --owner=0:0 --reproducible) | gzip -n -6 > "$stage/initrd.img"
log "initrd.img: $(du -h "$stage/initrd.img" | cut -f1)"

install -m 0755 "$agent" "$base/rootfs/usr/sbin/moat-agent"
used_kib=$(du -sk "$base/rootfs" | cut -f1)
nfiles=$(find "$base/rootfs" | wc -l)
size_kib=$(( used_kib * 12 / 10 + 8192 ))
# No journal: the image is only ever mounted read-only.
rm -f "$stage/rootfs.ext4"
truncate -s "${size_kib}k" "$stage/rootfs.ext4"
mkfs.ext4 -q -F -L moat-root -O ^has_journal -N $(( nfiles * 5 / 4 + 1024 )) \
	-E root_owner=0:0 -d "$base/rootfs" "$stage/rootfs.ext4" "${size_kib}k"
log "rootfs.ext4: $(( size_kib / 1024 )) MiB"

# Hard links where the cache and the output share a filesystem: the
# kernels never change once cached, and nobody writes to an image.
for f in vmlinuz vmlinux; do
	[ -f "$base/kernel/$f" ] || continue
	ln -f "$base/kernel/$f" "$stage/$f" 2>/dev/null || cp "$base/kernel/$f" "$stage/$f"
done

# --- manifest --------------------------------------------------------------
files_json=
content=
for f in vmlinuz vmlinux initrd.img rootfs.ext4; do
	[ -f "$stage/$f" ] || continue
	# the kernel's sums were taken once, with the cached base
	sum=$(awk -v f="$f" '$2 == f { print $1 }' "$base/kernel/sha256" 2>/dev/null)
	[ -n "$sum" ] || sum=$(sha256sum "$stage/$f" | cut -d' ' -f1)
	files_json+="${files_json:+, }\"$f\": {\"sha256\": \"$sum\", \"size\": $(stat -c %s "$stage/$f")}"
	content+="$f $sum"$'\n'
done
cat > "$stage/manifest.json" <<EOF
{
  "name": "$name",
  "content_hash": "$(printf '%s' "$content" | sha256sum | cut -d' ' -f1)",
  "base_key": "$key",
  "inputs": "$inputs",
  "kernel_version": "$(cat "$base/kernel/release")",
  "kernel_package": "$kernel_pkg $kernel_deb_version",
  "suite": "$suite",
  "packages": "$packages",
  "modules": [$(sed 's/.*/"&"/' "$base/kernel/modules.order" | paste -sd, | sed 's/,/, /g')],
  "languages": ["python", "bash", "sh"],
  "files": {$files_json},
  "created": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
EOF

# Swap in the new image whole, so a reader never sees half of one.
final=$out/$name
if [ -d "$final" ]; then
	mv "$final" "$out/.$name.old"
	mv "$stage" "$final"
	rm -rf "$out/.$name.old"
else
	mv "$stage" "$final"
fi
stage=
log "image $name ready in $final"

if [ "$check" = 1 ]; then
	exec "$script_dir/boot-check.sh" "$final"
fi
