# images/from_tar.sh: sourced by images/build.sh for --from-tar. Turns an
# untrusted root filesystem tarball (docker/podman export, an OCI
# image's flattened layers) into a root moat can boot, safely:
#   tar_unpack        checks the compression and every member name (no
#                     ".." component) before GNU tar unpacks it as root
#   tar_make_safe     removes device nodes, fifos and sockets, clears
#                     setuid/setgid bits, rewrites absolute symlinks and
#                     symlinks that climb above the root to relative ones
#                     inside it, so nothing on the host ever follows one out
#   tar_add_moat_files  the agent and the directories the guest mounts on,
#                     never written through a symlink
# Each change is appended to build.sh's `changes` array (the manifest's
# "changes"). Uses build.sh's log, die and agent. Not for: Debian-built
# images (build.sh's build_rootfs), or running anything from the tarball
# on the host: nothing in it is ever executed here.

tar_changes_total=0
tar_changes_kinds=()
# tar_change KIND TEXT: records one change: the first 20 in full, the
# rest counted by kind (tar_changes_summary adds the counts).
tar_change() {
	tar_changes_total=$((tar_changes_total + 1))
	tar_changes_kinds+=("$1")
	[ ${#changes[@]} -ge 20 ] || changes+=("$2")
}

tar_changes_summary() {
	local counts
	[ "$tar_changes_total" -gt 20 ] || return 0
	counts=$(printf '%s\n' "${tar_changes_kinds[@]}" | sort | uniq -c |
		awk '{ printf "%s%d %s", sep, $1, $2; sep = ", " }')
	changes+=("... $((tar_changes_total - 20)) more; in all $tar_changes_total changes: $counts")
}

# tar_decompressor FILE: the command that writes FILE's tar stream to
# stdout, by the file's magic, not its name.
tar_decompressor() {
	local magic
	magic=$(head -c 6 "$1" | od -An -tx1 | tr -d ' \n')
	case $magic in
	1f8b*) echo "gzip -dc" ;;
	fd377a585a00) echo "xz -dc" ;;
	28b52ffd*) echo "zstd -dcq" ;;
	425a68*|04224d18*|5d0000*)
		die "$1 is compressed in a way build.sh does not read (bzip2, lz4 or lzma): recompress it with gzip, xz or zstd, or pass the plain .tar" ;;
	*)
		# GNU tar writes an archive without members as zero blocks
		[ -n "$(head -c 1048576 "$1" | tr -d '\0' | head -c 1)" ] ||
			die "$1 is an empty tarball: it must hold a root filesystem (/bin/sh at least)"
		[ "$(tail -c +258 "$1" | head -c 5)" = ustar ] ||
			die "$1 is not a tarball (no tar header, no gzip/xz/zstd magic): pass a root filesystem tar such as 'docker export' writes"
		echo cat ;;
	esac
}

tar_unpack() {
	local file=$1 root=$2 decomp names name n=0 tool
	decomp=$(tar_decompressor "$file")
	tool=${decomp%% *}
	command -v "$tool" >/dev/null || die "$tool is missing: apt-get install $tool"
	names=$work/tar-names
	# GNU tar's default quoting escapes newlines in names: one a line.
	$decomp < "$file" | tar -t -f - > "$names" 2>"$work/tar-err" ||
		die "$file is not a readable tarball: $(head -c 300 "$work/tar-err")"
	while IFS= read -r name; do
		n=$((n + 1))
		case "/$name/" in
		*/../*) die "tarball member \"$name\" has a \"..\" component and would land outside the root: remove it from the tarball (moat refuses such tarballs)" ;;
		esac
	done < "$names"
	[ "$n" -gt 0 ] || die "$file is an empty tarball: it must hold a root filesystem (/bin/sh at least)"
	mkdir -m 0755 "$root"
	# Absolute and ".." symlinks: GNU tar makes them only after every
	# other member is out, so no member is written through one.
	# A node that may not make device nodes (a container without
	# CAP_MKNOD) fails only those members: tar_make_safe would remove
	# them anyway.
	if ! $decomp < "$file" | tar -x -f - -C "$root" --numeric-owner \
		--same-owner --same-permissions 2>"$work/tar-err"; then
		grep -v -e 'Cannot mknod' -e 'Removing leading' \
			-e 'Exiting with failure status' "$work/tar-err" > "$work/tar-err2" || true
		[ ! -s "$work/tar-err2" ] ||
			die "unpacking $file failed: $(head -c 300 "$work/tar-err2")"
		while IFS= read -r name; do
			tar_change removed "left out device node ${name%%: Cannot mknod*}"
		done < <(sed -n 's/^tar: //p' "$work/tar-err" | grep 'Cannot mknod')
	fi
	log "unpacked $n members of $file: $(du -sh "$root" | cut -f1)"
}

# tar_norm DIR TARGET: sets tar_inside to the path a symlink in DIR
# (absolute, inside the root) to TARGET names, folded lexically inside
# the root, as a chroot would, and tar_climbs=1 when a relative TARGET
# goes above the root. (No subshell: it sets two variables.)
tar_norm() {
	local path comp out=()
	tar_climbs=0
	case $2 in
	/*) path=$2 ;;
	*) path=$1/$2 ;;
	esac
	local comps
	IFS=/ read -ra comps <<< "$path"
	for comp in "${comps[@]}"; do
		case $comp in
		''|.) ;;
		..)
			if [ ${#out[@]} -gt 0 ]; then
				unset 'out[${#out[@]}-1]'
			else
				tar_climbs=1
			fi ;;
		*) out+=("$comp") ;;
		esac
	done
	local IFS=/
	tar_inside="/${out[*]}"
}

tar_make_safe() {
	local root=$1 p rel kind mode target dir new
	while IFS= read -r -d '' p; do
		case $(stat -c %F "$p") in
		'block special file') kind='block device' ;;
		'character special file') kind='character device' ;;
		fifo) kind=fifo ;;
		*) kind=socket ;;
		esac
		rm -f "$p"
		tar_change removed "removed $kind ${p#"$root"}"
	done < <(find "$root" \( -type b -o -type c -o -type p -o -type s \) -print0)
	while IFS= read -r -d '' p; do
		mode=$(stat -c %a "$p")
		chmod ug-s "$p"
		tar_change setid "cleared setuid/setgid on ${p#"$root"} ($mode -> $(stat -c %a "$p"))"
	done < <(find "$root" -type f -perm /6000 -print0)
	while IFS= read -r -d '' p; do
		rel=${p#"$root"}
		target=$(readlink "$p")
		dir=$(dirname "$rel")
		tar_norm "$dir" "$target"
		case $target in
		/*) ;;
		*) [ "$tar_climbs" = 1 ] || continue ;;
		esac
		new=$(realpath -m -s --relative-to="$dir" "$tar_inside")
		ln -sfn "$new" "$p"
		tar_change symlink "symlink $rel -> $target rewritten to $new (inside the image)"
	done < <(find "$root" -type l -print0)
	tar_changes_summary
	log "made safe: $tar_changes_total changes"
}

# tar_real_dir ROOT REL MODE: prints the real directory that REL names
# inside ROOT, following the root's own (now relative) symlinks, making
# what is missing; dies if it resolves outside ROOT or is not a
# directory. Every component of what it prints is a real directory.
tar_real_dir() {
	local root=$1 rel=$2 mode=$3 real cur comp
	real=$(realpath -m "$root/$rel")
	case $real/ in
	"$root"/*) ;;
	*) die "the tarball's /$rel resolves outside the root through its symlinks: fix the tarball" ;;
	esac
	cur=$root
	local comps
	IFS=/ read -ra comps <<< "${real#"$root"}"
	for comp in "${comps[@]}"; do
		[ -n "$comp" ] || continue
		cur=$cur/$comp
		if [ -L "$cur" ]; then
			die "the tarball's ${cur#"$root"} is a symlink where a directory was resolved: fix the tarball"
		elif [ ! -e "$cur" ]; then
			mkdir -m "$mode" "$cur"
			tar_change added "added directory ${cur#"$root"}"
		elif [ ! -d "$cur" ]; then
			die "the tarball's ${cur#"$root"} is not a directory, but moat needs /$rel: fix the tarball"
		fi
	done
	printf '%s' "$cur"
}

tar_add_moat_files() {
	local root=$1 d sh sbin
	sh=$(realpath -m "$root/bin/sh")
	case $sh in
	"$root"/*) ;;
	*) sh= ;;
	esac
	[ -n "$sh" ] && [ -f "$sh" ] && [ -x "$sh" ] ||
		die "the tarball has no /bin/sh: the sandbox runs commands through /bin/sh; add a shell (e.g. busybox with a sh link) and rebuild"
	# The guest mounts /dev /proc /sys /run on these, runs execs in /root.
	for d in dev proc sys run tmp root; do
		tar_real_dir "$root" "$d" 0755 > /dev/null
	done
	chmod 1777 "$(tar_real_dir "$root" tmp 0755)"
	chmod 0700 "$(tar_real_dir "$root" root 0755)"
	tar_real_dir "$root" usr/sbin 0755 > /dev/null # records what it adds
	sbin=$(tar_real_dir "$root" usr/sbin 0755)
	if [ -e "$sbin/moat-agent" ] || [ -L "$sbin/moat-agent" ]; then
		rm -f "$sbin/moat-agent"
		tar_change replaced "replaced the tarball's ${sbin#"$root"}/moat-agent"
	fi
	install -m 0755 "$agent" "$sbin/moat-agent"
	# Changes made here come after tar_make_safe's summary: re-summarise.
	if [ "$tar_changes_total" -gt 20 ]; then
		changes=("${changes[@]:0:20}")
		tar_changes_summary
	fi
}
