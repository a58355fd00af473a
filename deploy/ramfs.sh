#!/usr/bin/env bash
# A directory for guest RAM with reflinks: an XFS filesystem (reflink=1)
# on a sparse file in /dev/shm, loop-mounted at DIR. moat-vmd's
# --ram-dir DIR then clones a guest's RAM file for a snapshot (a few
# milliseconds of pause) instead of copying it while the guest is paused
# (tens of milliseconds, growing with RAM), and snapshots and clones share
# the blocks they have in common. Memory is only used as blocks are
# written, and given back as soon as blocks are freed: the mount discards
# them, so the loop device punches holes in the backing file (without
# that, tmpfs keeps every block XFS ever used). Usage:
#   deploy/ramfs.sh up DIR [SIZE]   make or reuse it (SIZE default 16G,
#                                   at most the tmpfs's size); prints DIR
#   deploy/ramfs.sh down DIR        unmount it and free its memory
#   deploy/ramfs.sh check DIR       exit 0 if DIR is such a mount
# Needs root, mkfs.xfs (xfsprogs) and a loop device; `up` exits 3 with a
# reason when it cannot, and callers fall back to /dev/shm (copies).
# Not for: persistence: everything in it is gone when the host reboots,
# as with /dev/shm.
set -euo pipefail

die() { echo "ramfs: $*" >&2; exit "${2:-1}"; }

backing() {
	# One backing file per mount point, named after its path.
	local h
	h=$(printf '%s' "$1" | sha256sum | cut -c1-16)
	echo "/dev/shm/moat-ramfs-$h.img"
}

mounted_xfs() {
	[ "$(findmnt -n -o FSTYPE --target "$1" 2>/dev/null)" = xfs ] &&
		[ "$(findmnt -n -o TARGET --target "$1" 2>/dev/null)" = "$1" ]
}

up() {
	local dir=$1 size=${2:-16G} img
	[ "$(id -u)" -eq 0 ] || die "needs root (mount, loop device)" 3
	command -v mkfs.xfs >/dev/null || die "mkfs.xfs not found: apt-get install xfsprogs" 3
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd -P)
	if mounted_xfs "$dir"; then
		echo "$dir"
		return 0
	fi
	img=$(backing "$dir")
	if [ ! -f "$img" ]; then
		truncate -s "$size" "$img.tmp"
		mkfs.xfs -q -m reflink=1 "$img.tmp" >/dev/null 2>&1 ||
			{ rm -f "$img.tmp"; die "mkfs.xfs failed on $img" 3; }
		mv "$img.tmp" "$img"
	fi
	mount -o loop,noatime,discard "$img" "$dir" 2>/dev/null ||
		die "cannot loop-mount $img on $dir (no loop device?)" 3
	chmod 0700 "$dir"
	echo "$dir"
}

down() {
	local dir=$1 img
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd -P)
	img=$(backing "$dir")
	if mounted_xfs "$dir"; then
		umount "$dir" || umount -l "$dir"
	fi
	rm -f "$img" "$img.tmp"
}

case "${1:-}" in
up) [ $# -ge 2 ] || die "usage: ramfs.sh up DIR [SIZE]" 2; up "$2" "${3:-16G}" ;;
down) [ $# -ge 2 ] || die "usage: ramfs.sh down DIR" 2; down "$2" ;;
check) [ $# -ge 2 ] || die "usage: ramfs.sh check DIR" 2; mounted_xfs "$(cd "$2" && pwd -P)" ;;
*) die "usage: deploy/ramfs.sh up DIR [SIZE] | down DIR | check DIR" 2 ;;
esac
