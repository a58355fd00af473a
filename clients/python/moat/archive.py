"""Directories as tar archives for sb.files.upload_dir / download_dir
(issue 17): packing a local directory into a temporary file (so memory
stays bounded whatever its size), and unpacking a downloaded archive into
a local directory only after every member passed the checks: no absolute
or `..` names, no device nodes or fifos, no link that points out of the
directory, no member under a symlink member, no name twice, and no
symlink already on disk in the way. Symlinks are kept as links; modes
keep their permission bits only (no setuid). Not for: the HTTP calls
(sandbox.py, client.py) or the guest's own checks (the agent's)."""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from typing import IO, Dict, List, Optional

from .errors import InvalidArgument

_COPY_BLOCK = 1 << 20


@dataclass
class ArchiveSummary:
    """What a directory copy wrote: regular files, directories and
    symlinks, and the bytes of the files' contents."""
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0


def _refuse(what: str) -> InvalidArgument:
    return InvalidArgument("INVALID_ARGUMENT", what)


def pack_dir(local_dir: str) -> IO[bytes]:
    """pack_dir: the contents of `local_dir` (not the directory itself:
    its entries at the archive's top) as a tar archive in an unnamed
    temporary file, rewound; symlinks stored as links. A device node,
    fifo or socket in it is refused, naming it."""
    if not os.path.isdir(local_dir):
        raise _refuse(f"upload_dir: {local_dir} is not a directory: give "
                      f"a local directory (its contents are copied)")

    def only_plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if not (info.isreg() or info.isdir() or info.issym() or
                info.islnk()):
            raise _refuse(f"upload_dir: {info.name} in {local_dir} is a "
                          f"device node, fifo or socket: sandboxes take "
                          f"none; move it out of the directory")
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    tmp = tempfile.TemporaryFile()
    try:
        with tarfile.open(fileobj=tmp, mode="w",
                          format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(os.listdir(local_dir)):
                path = os.path.join(local_dir, name)
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    only_plain(tarfile.TarInfo(name))  # raises
                tar.add(path, arcname=name, recursive=True,
                        filter=only_plain)
        tmp.seek(0)
        return tmp
    except BaseException:
        tmp.close()
        raise


def _clean_name(name: str) -> str:
    """_clean_name: a member's name relative to the target, "" for the
    target itself; refused when absolute or with a `..` part."""
    if name.startswith("/") or "\\" in name or "\0" in name:
        raise _refuse(f"download_dir: the archive's member {name!r} is "
                      f"an absolute path: nothing was written")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(f"download_dir: the archive's member {name!r} "
                      f"reaches out of the directory (..): nothing was "
                      f"written")
    return "/".join(parts)


def _check_link(name: str, target: str) -> None:
    """_check_link: a symlink `name` -> `target` must stay inside."""
    if target.startswith("/"):
        raise _refuse(f"download_dir: the symlink {name!r} points to the "
                      f"absolute path {target!r}, out of the directory: "
                      f"nothing was written")
    resolved = posixpath.normpath(
        posixpath.join(posixpath.dirname(name), target))
    if resolved == ".." or resolved.startswith("../"):
        raise _refuse(f"download_dir: the symlink {name!r} points to "
                      f"{target!r}, out of the directory: nothing was "
                      f"written")


def check_members(members: List[tarfile.TarInfo]) -> Dict[str, str]:
    """check_members: every member of a downloaded archive checked before
    anything is written; the members' clean names by their names in the
    archive. Raises InvalidArgument naming the first bad member."""
    names: Dict[str, str] = {}
    kinds: Dict[str, tarfile.TarInfo] = {}
    for m in members:
        clean = _clean_name(m.name)
        if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
            raise _refuse(f"download_dir: the archive's member {m.name!r} "
                          f"is a device node or fifo: nothing was written")
        if clean in kinds and not (m.isdir() and kinds[clean].isdir()):
            raise _refuse(f"download_dir: the archive holds {m.name!r} "
                          f"twice: nothing was written")
        if clean == "" and not m.isdir():
            raise _refuse(f"download_dir: the archive's member {m.name!r} "
                          f"is the directory itself but not a directory: "
                          f"nothing was written")
        if m.issym():
            _check_link(clean, m.linkname)
        if m.islnk():
            target = _clean_name(m.linkname)
            if target not in kinds or not kinds[target].isreg():
                raise _refuse(f"download_dir: the hard link {m.name!r} "
                              f"names {m.linkname!r}, no file before it "
                              f"in the archive: nothing was written")
        names[m.name] = clean
        kinds[clean] = m
    links = {c for c, m in kinds.items() if m.issym()}
    for clean in kinds:
        parts = clean.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in links:
                raise _refuse(f"download_dir: {clean!r} lies under the "
                              f"symlink {'/'.join(parts[:i])!r} of the "
                              f"same archive: nothing was written")
    return names


def _no_link_on_disk(root: str, clean: str) -> None:
    """_no_link_on_disk: no directory on the way to `clean` under `root`
    is a symlink already there (it would carry the write elsewhere)."""
    parts = clean.split("/")[:-1]
    path = root
    for p in parts:
        path = os.path.join(path, p)
        if os.path.islink(path):
            raise _refuse(f"download_dir: {path} is a symlink on this "
                          f"machine: {clean!r} would be written through "
                          f"it; remove it or pick another directory: "
                          f"nothing was written")


def _write_file(tar: tarfile.TarFile, m: tarfile.TarInfo, path: str) -> int:
    src = tar.extractfile(m)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(
        os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(f"download_dir: {path} is a symlink on this "
                          f"machine: remove it or pick another directory")
        raise
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(src, out, _COPY_BLOCK)
    os.chmod(path, m.mode & 0o777)
    return m.size


def unpack(archive: IO[bytes], local_dir: str) -> ArchiveSummary:
    """unpack: the tar archive `archive` (a seekable file) into
    `local_dir` (made if missing), once every member passed
    check_members and no symlink on disk is in the way: directories
    first, then files, then symlinks last (so no write goes through a
    link the archive made)."""
    try:
        tar = tarfile.open(fileobj=archive, mode="r:")
    except tarfile.TarError as e:
        raise _refuse(f"download_dir: the sandbox's archive does not read "
                      f"as tar ({e}): nothing was written") from None
    with tar:
        members = tar.getmembers()
        names = check_members(members)
        root = os.path.abspath(local_dir)
        for m in members:
            if names[m.name]:
                _no_link_on_disk(root, names[m.name])
        os.makedirs(root, exist_ok=True)
        out = ArchiveSummary()
        dirs = [m for m in members if m.isdir()]
        for m in dirs:
            os.makedirs(os.path.join(root, names[m.name]), exist_ok=True)
            out.dirs += 1 if names[m.name] else 0
        for m in members:
            path = os.path.join(root, names[m.name])
            if m.isreg():
                out.bytes += _write_file(tar, m, path)
                out.files += 1
            elif m.islnk():
                target = os.path.join(root, _clean_name(m.linkname))
                if os.path.lexists(path):
                    os.unlink(path)
                os.link(target, path)
                out.files += 1
        for m in members:
            if m.issym():
                path = os.path.join(root, names[m.name])
                if os.path.islink(path) or os.path.isfile(path):
                    os.unlink(path)
                os.symlink(m.linkname, path)
                out.symlinks += 1
        # Directory modes last: a read-only one would refuse its files.
        for m in reversed(dirs):
            os.chmod(os.path.join(root, names[m.name]),
                     (m.mode & 0o777) | 0o700)
        return out


def summary_of(reply: Dict[str, Optional[object]]) -> ArchiveSummary:
    """summary_of: an ArchivePutReply (proto3 JSON) as a summary."""
    return ArchiveSummary(files=int(reply.get("files") or 0),
                          dirs=int(reply.get("dirs") or 0),
                          symlinks=int(reply.get("symlinks") or 0),
                          bytes=int(reply.get("bytes") or 0))
