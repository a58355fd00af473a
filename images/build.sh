#!/bin/bash
# images/build.sh: builds a moat guest image (kernel, initramfs, read-only
# root filesystem, manifest) without mounting anything, from one of:
#   - Debian packages: the default image (python3, busybox, nodejs);
#   - a spec (--spec FILE, issue 17): the default packages plus the spec's,
#     its [files] copied in, its [run] lines run, its [env] defaults kept
#     in /etc/moat/env (the agent adds them to every exec's environment);
#   - a root filesystem tarball (--from-tar FILE, e.g. docker export):
#     unpacked safely and made harmless (below), the agent added.
# The expensive parts are cached under ${MOAT_CACHE_DIR:-/var/cache/moat}/
# images/: the kernel and its modules in kernel-<key>/ (keyed by kernel
# package version and module list), each Debian root filesystem in
# <key>/ (keyed by this script, the suite, the package list and the
# spec's id), so a new moat-agent only re-runs the cheap steps (cpio +
# mkfs, ~1 s).
# A spec's [run] lines run in a chroot made by mmdebstrap's
# --customize-hook, with no network (unshare --net), not in a build VM:
# the packages come from the host's apt sources through mmdebstrap, while
# a build VM would need networking that guests do not have and a TCG boot
# per build. The chroot runs as root on the build node: spec run lines
# are trusted like the operator who starts the build.
# A tarball is untrusted: its member names are checked before GNU tar
# (which itself refuses ".." and strips a leading "/") unpacks it, then
# device nodes, fifos and sockets are removed, setuid/setgid bits
# cleared, absolute or climbing symlinks rewritten to relative ones
# inside the root, and moat's files are never written through a
# symlink; the manifest's "changes" lists what was changed.
# Not for: starting VMs (moat-vmd does that; images/boot-check.sh boots an
# image once to check it), or making scratch disks (vmd makes those).
#
# usage: images/build.sh [--agent PATH] [--out DIR] [--name NAME] [--spec FILE | --from-tar FILE] [--check] [--force]
# Output: OUT/NAME/{vmlinuz, vmlinux, initrd.img, rootfs.ext4,
# manifest.json}. Needs root (mmdebstrap, device nodes in the rootfs),
# apt lists (apt-get update), and mmdebstrap, e2fsprogs, cpio, kmod, gzip;
# lz4/xz/zstd for vmlinux; moat-image-spec (next to the agent) for --spec.
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

spec=
from_tar=
name_given=
while [ $# -gt 0 ]; do
	case $1 in
	--agent) agent=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--name) name=$2; name_given=1; shift 2 ;;
	--spec) spec=$2; shift 2 ;;
	--from-tar) from_tar=$2; shift 2 ;;
	--check) check=1; shift ;;
	--force) force=1; shift ;;
	-h|--help) usage 0 ;;
	*) echo "images: unknown argument: $1" >&2; usage 2 ;;
	esac
done
[ -z "$spec" ] || [ -z "$from_tar" ] ||
	die "--spec and --from-tar build different images: pass one"

# json_str S: S as a JSON string (the spec parser lets no control
# character through; a tarball's file names are escaped here too).
json_str() {
	local s=$1
	s=${s//\\/\\\\}
	s=${s//\"/\\\"}
	s=${s//$'\t'/\\t}
	s=${s//$'\n'/\\n}
	printf '"%s"' "$s"
}

# --- what to build: the source, its name, its packages ----------------------
source_kind=default
spec_id=
spec_lines=
spec_languages=()
declare -A spec_env=()
spec_env_keys=()
if [ -n "$spec" ]; then
	[ -f "$spec" ] || die "no spec file at $spec: pass --spec PATH/NAME.ini"
	spec_tool=${MOAT_IMAGE_SPEC_TOOL:-$(dirname "$agent")/moat-image-spec}
	[ -x "$spec_tool" ] || die "no moat-image-spec at $spec_tool (it sits next to moat-agent): build it (make -C build moat-image-spec)"
	spec_lines=$("$spec_tool" "$spec") || die "spec $spec is not valid (see above): fix it"
	spec_id=$("$spec_tool" --id "$spec") || die "cannot hash spec $spec (see above)"
	[ -n "$name_given" ] || { name=$(basename "$spec"); name=${name%.ini}; }
	source_kind="spec:$name"
	while IFS=$'\t' read -r kind v1 v2; do
		case $kind in
		suite) suite=$v1 ;;
		package) packages+=",$v1" ;;
		language) spec_languages+=("$v1") ;;
		env) spec_env[$v1]=$v2; spec_env_keys+=("$v1") ;;
		esac
	done <<< "$spec_lines"
elif [ -n "$from_tar" ]; then
	[ -f "$from_tar" ] || die "no tarball at $from_tar: pass --from-tar PATH/ROOTFS.tar[.gz|.xz|.zst]"
	tar_base=$(basename "$from_tar")
	if [ -z "$name_given" ]; then
		name=$tar_base
		for ext in .tar.gz .tgz .tar.xz .tar.zst .tar; do name=${name%"$ext"}; done
	fi
	source_kind="tar:$tar_base"
fi

case $name in
''|*[!A-Za-z0-9._-]*|.*) die "image name \"$name\" must be letters, digits, . _ - (not starting with .): pass --name NAME" ;;
esac
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, device nodes in the rootfs): run it with sudo"
[ -f "$agent" ] || die "no agent binary at $agent: build it first (make -C build moat-agent) or pass --agent PATH"
# A dynamic binary names its loader; the initramfs has no libc.
! LC_ALL=C grep -q '/lib64/ld-linux' "$agent" ||
	die "$agent is not a static binary: the initramfs has no libc"
for tool in mmdebstrap mkfs.ext4 cpio depmod gzip dpkg-deb dpkg-query apt-get apt-cache sha256sum flock tar unshare; do
	command -v "$tool" >/dev/null || die "$tool is missing: apt-get install mmdebstrap e2fsprogs cpio kmod gzip tar util-linux"
done

# --- kernel package version and the cache keys ------------------------------
# The metapackage pins the versioned one: "Depends: linux-image-R (= V)".
read -r kernel_pkg kernel_deb_version < <(apt-cache show --no-all-versions \
	"$kernel_meta" 2>/dev/null | sed -n \
	's/^Depends:.*\(linux-image-[^ ,]*\) (= \([^)]*\)).*/\1 \2/p' | head -n 1) || true
if [ -z "${kernel_pkg:-}" ] || [ -z "${kernel_deb_version:-}" ]; then
	die "apt does not know $kernel_meta: run apt-get update"
fi
kernel_release=${kernel_pkg#linux-image-}
# The kernel's key changes when its package or the module list (or the
# way build_kernel lays them out: kernel_layout) does, not with the rest
# of this script, so every root filesystem shares one cached kernel.
kernel_layout=1
kernel_key=$(echo "$kernel_layout $kernel_pkg $kernel_deb_version ${wanted_modules[*]}" |
	sha256sum | cut -c1-16)
kdir=$cache_root/kernel-$kernel_key
key=$( { sha256sum < "${BASH_SOURCE[0]}"; echo "$kernel_key";
	echo "$suite $packages"; [ -z "$spec_id" ] || echo "spec $spec_id"; } |
	sha256sum | cut -c1-16)
base=$cache_root/$key
if [ -n "$from_tar" ]; then
	tar_sum=$(sha256sum < "$from_tar" | cut -d' ' -f1)
	log "kernel $kernel_pkg ($kernel_deb_version), root filesystem from $from_tar"
else
	log "kernel $kernel_pkg ($kernel_deb_version), suite $suite, packages $packages${spec_id:+, spec ${spec_id:0:16}}, cache key $key"
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9 # one build at a time: the cached rootfs gets this agent copied in

# Same script, kernel, packages, spec (or tarball) and agent as the image
# already there: done.
inputs=$( { echo "$key"; sha256sum < "$agent"; [ -z "$from_tar" ] || echo "tar $tar_sum"; } |
	sha256sum | cut -c1-64)
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
# spec_hook FILE: writes the --customize-hook script of the spec: its
# [files] copied in, then its [run] lines in order, each in a chroot of
# the new root ("$1") with no network and a clean environment holding the
# spec's [env]. Values are quoted with printf %q.
spec_hook() {
	local hook=$1 spec_dir kind v1 v2 v3 k env_args=()
	# run directly by mmdebstrap, with the root as $1
	spec_dir=$(cd "$(dirname "$spec")" && pwd)
	for k in "${spec_env_keys[@]}"; do env_args+=("$k=${spec_env[$k]}"); done
	{
		echo '#!/bin/bash'
		echo 'set -eu'
		echo 'root=$1'
		while IFS=$'\t' read -r kind v1 v2 v3; do
			case $kind in
			file)
				# "-": the source file's mode, without setuid bits
				[ "$v3" != - ] ||
					v3=$(printf '%04o' $(( 0$(stat -c %a "$spec_dir/$v2") & 0755 )))
				printf 'install -D -m %q %q "$root"%q\n' "$v3" "$spec_dir/$v2" "$v1"
				printf 'echo %q >&2\n' "images: spec: copied $v2 to $v1"
				;;
			run)
				printf 'echo %q >&2\n' "images: spec: run: $v1"
				printf 'unshare --net chroot "$root" /usr/bin/env -i %s %s /bin/sh -ec %q\n' \
					'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8' \
					"$( ((${#env_args[@]})) && printf '%q ' "${env_args[@]}")" "$v1"
				;;
			esac
		done <<< "$spec_lines"
	} > "$hook"
	chmod 0700 "$hook"
}

build_rootfs() {
	local dir=$1 f mirrors=() hooks=() k
	# The mirror comes from the host's apt sources (mmdebstrap pastes a
	# file argument into the chroot's sources), never from this script.
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[ -s "$f" ] && grep -Eq '^[[:space:]]*(deb|Types:)' "$f" && mirrors+=("$f")
	done
	[ ${#mirrors[@]} -gt 0 ] || die "no apt sources on this host (/etc/apt/sources.list*)"
	if [ -n "$spec" ]; then
		spec_hook "$work/spec-hook.sh"
		hooks=(--customize-hook="$work/spec-hook.sh")
	fi
	log "mmdebstrap $suite (minbase + $packages), sources from ${mirrors[*]}"
	mmdebstrap --quiet --variant=minbase --include="$packages" "${hooks[@]}" \
		"$suite" "$dir" "${mirrors[@]}" ||
		die "mmdebstrap failed (see above${spec:+; a spec [run] line that fails fails the build})"
	rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/* \
		"$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* \
		"$dir"/usr/share/lintian "$dir"/var/log/*.log "$dir"/var/log/apt/* \
		"$dir"/var/cache/debconf/*-old "$dir"/var/lib/dpkg/*-old
	find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
	mkdir -p "$dir/root" && chmod 0700 "$dir/root"
	echo moat > "$dir/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\tmoat\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
		> "$dir/etc/hosts"
	if [ ${#spec_env_keys[@]} -gt 0 ]; then
		mkdir -p "$dir/etc/moat"
		for k in "${spec_env_keys[@]}"; do
			printf '%s=%s\n' "$k" "${spec_env[$k]}"
		done > "$dir/etc/moat/env"
	fi
	log "rootfs: $(du -sh "$dir" | cut -f1)"
}

if [ ! -d "$kdir" ]; then
	log "no cached kernel: extracting $kernel_pkg"
	build_kernel "$work/kernel"
	mv "$work/kernel" "$kdir"
fi
touch "$kdir"
changes=()
if [ -n "$from_tar" ]; then
	# shellcheck source=images/from_tar.sh
	. "$script_dir/from_tar.sh"
	root=$work/root
	tar_unpack "$from_tar" "$root"
	tar_make_safe "$root"
	tar_add_moat_files "$root"
elif [ ! -d "$base" ]; then
	log "no cached base: building the root filesystem (about a minute)"
	mkdir -p "$work/base"
	build_rootfs "$work/base/rootfs"
	printf '{"kernel_key": "%s", "suite": "%s", "packages": "%s", "spec_id": "%s"}\n' \
		"$kernel_key" "$suite" "$packages" "$spec_id" > "$work/base/info.json"
	mv "$work/base" "$base"
	root=$base/rootfs
else
	log "cached base $base"
	root=$base/rootfs
fi
[ -n "$from_tar" ] || touch "$base"
# Keep the four root filesystems and two kernels used last (other specs,
# other versions of this script, other checkouts sharing the cache).
find "$cache_root" -mindepth 1 -maxdepth 1 -type d -regextype egrep \
	-regex '.*/[0-9a-f]{16}' -printf '%T@ %p\n' | sort -rn | tail -n +5 |
	cut -d' ' -f2- | xargs -r rm -rf
find "$cache_root" -mindepth 1 -maxdepth 1 -type d -regextype egrep \
	-regex '.*/kernel-[0-9a-f]{16}' -printf '%T@ %p\n' | sort -rn | tail -n +3 |
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
cp "$kdir"/modules/*.ko "$initramfs/lib/modules/" 2>/dev/null || true
cp "$kdir/modules.order" "$initramfs/etc/moat/modules"
(cd "$initramfs" && find . -mindepth 1 | LC_ALL=C sort |
	cpio --quiet -o -H newc --owner=0:0 --reproducible) | gzip -n -6 > "$stage/initrd.img"
log "initrd.img: $(du -h "$stage/initrd.img" | cut -f1)"

# A tarball's root got the agent from tar_add_moat_files (never through
# a symlink); a Debian root's usr/sbin is Debian's own directory.
[ -n "$from_tar" ] || install -m 0755 "$agent" "$root/usr/sbin/moat-agent"
used_kib=$(du -sk "$root" | cut -f1)
nfiles=$(find "$root" | wc -l)
size_kib=$(( used_kib * 12 / 10 + 8192 ))
# No journal: the image is only ever mounted read-only.
rm -f "$stage/rootfs.ext4"
truncate -s "${size_kib}k" "$stage/rootfs.ext4"
mkfs.ext4 -q -F -L moat-root -O ^has_journal -N $(( nfiles * 5 / 4 + 1024 )) \
	-E root_owner=0:0 -d "$root" "$stage/rootfs.ext4" "${size_kib}k"
log "rootfs.ext4: $(( size_kib / 1024 )) MiB"

# Hard links where the cache and the output share a filesystem: the
# kernels never change once cached, and nobody writes to an image.
for f in vmlinuz vmlinux; do
	[ -f "$kdir/$f" ] || continue
	ln -f "$kdir/$f" "$stage/$f" 2>/dev/null || cp "$kdir/$f" "$stage/$f"
done

# --- manifest --------------------------------------------------------------
# json_list ITEM...: a JSON array of strings.
json_list() {
	local item sep=
	printf '['
	for item in "$@"; do printf '%s%s' "$sep" "$(json_str "$item")"; sep=', '; done
	printf ']'
}

# The spec's languages, else what the root has (a tarball's symlinks
# stay inside it, so -e looks only there).
languages=("${spec_languages[@]}")
if [ ${#languages[@]} = 0 ]; then
	[ -e "$root/usr/bin/python3" ] && languages+=(python)
	{ [ -e "$root/usr/bin/node" ] || [ -e "$root/usr/bin/nodejs" ]; } && languages+=(node)
	{ [ -e "$root/bin/bash" ] || [ -e "$root/usr/bin/bash" ]; } && languages+=(bash)
	[ -e "$root/bin/sh" ] && languages+=(sh)
fi
installed=()
if [ -f "$root/var/lib/dpkg/status" ]; then
	mapfile -t installed < <(dpkg-query --admindir="$root/var/lib/dpkg" -W \
		-f '${db:Status-Abbrev}\t${Package}=${Version}\n' | awk -F'\t' '$1 ~ /^ii/ { print $2 }' | LC_ALL=C sort)
fi
env_json=
for k in "${spec_env_keys[@]}"; do
	env_json+="${env_json:+, }$(json_str "$k"): $(json_str "${spec_env[$k]}")"
done
files_json=
content=
for f in vmlinuz vmlinux initrd.img rootfs.ext4; do
	[ -f "$stage/$f" ] || continue
	# the kernel's sums were taken once, when it was cached
	sum=$(awk -v f="$f" '$2 == f { print $1 }' "$kdir/sha256" 2>/dev/null)
	[ -n "$sum" ] || sum=$(sha256sum "$stage/$f" | cut -d' ' -f1)
	files_json+="${files_json:+, }\"$f\": {\"sha256\": \"$sum\", \"size\": $(stat -c %s "$stage/$f")}"
	content+="$f $sum"$'\n'
done
{
	cat <<EOF
{
  "name": "$name",
  "content_hash": "$(printf '%s' "$content" | sha256sum | cut -d' ' -f1)",
  "base_key": "$([ -n "$from_tar" ] && echo "kernel-$kernel_key" || echo "$key")",
  "inputs": "$inputs",
  "source": $(json_str "$source_kind"),
  "kernel_version": "$(cat "$kdir/release")",
  "kernel_package": "$kernel_pkg $kernel_deb_version",
EOF
	if [ -z "$from_tar" ]; then
		printf '  "suite": "%s",\n  "packages": "%s",\n' "$suite" "$packages"
	else
		printf '  "tar_sha256": "%s",\n  "changes": %s,\n' "$tar_sum" "$(json_list "${changes[@]}")"
	fi
	[ -z "$spec_id" ] || printf '  "spec_id": "%s",\n' "$spec_id"
	cat <<EOF
  "modules": [$(sed 's/.*/"&"/' "$kdir/modules.order" | paste -sd, | sed 's/,/, /g')],
  "languages": $(json_list "${languages[@]}"),
  "env": {$env_json},
  "installed_packages": $(json_list "${installed[@]}"),
  "files": {$files_json},
  "created": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
EOF
} > "$stage/manifest.json"

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
