"""Sandboxes of the moat SDK: a Sandbox object per microVM, with code
runs in persistent contexts (RunCode), commands (Exec), files (whole
directories as tar archives too: archive.py), snapshots
and time travel through its recorded session (RestoreStep, Fork,
ListSteps, SetStepKeep), and the result types those return. Every call is one Gateway
method through Client.call (directories: the files REST route). Not for: the transport or error mapping
(client.py, errors.py)."""

from __future__ import annotations

import http.client
import os
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .archive import ArchiveSummary, pack_dir, summary_of, unpack
from .client import Client, from_b64, to_b64, to_int
from .errors import MoatError, Unavailable, code_name, error_for

_POLICIES = {
    "manual": "SNAPSHOT_POLICY_MANUAL",
    "every": "SNAPSHOT_POLICY_EVERY",
    "none": "SNAPSHOT_POLICY_NONE",
}

# Files travel in pieces well under the gateway's 4 MiB body cap once
# base64 has grown them by a third.
_WRITE_CHUNK = 2 * 1024 * 1024


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _seconds_to_ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return 0
    if timeout <= 0:
        raise ValueError("timeout must be positive seconds (None: the "
                         "node's default)")
    return max(1, int(timeout * 1000))


# ---- results ----

@dataclass
class ExecutionError:
    """The exception a code run raised: its class name, its str() and
    the formatted traceback."""
    name: str
    value: str
    traceback: str

    def __str__(self) -> str:
        return f"{self.name}: {self.value}" if self.value else self.name


@dataclass
class Execution:
    """One run of code in a context. `result` is the repr of the last
    expression (None when there was none); `error` is set when the code
    raised or timed out (a timeout is a KeyboardInterrupt); `step` is
    the recorded step's index (None when not recorded)."""
    stdout: str = ""
    stderr: str = ""
    result: Optional[str] = None
    error: Optional[ExecutionError] = None
    step: Optional[int] = None
    session_id: Optional[str] = None
    context: str = "default"
    language: str = "python"
    timed_out: bool = False
    context_created: bool = False
    execution_count: int = 0
    duration_us: int = 0
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    recording_error: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def _from_reply(cls, reply: Mapping[str, Any]) -> "Execution":
        r = reply.get("result") or {}
        out, err = from_b64(r.get("stdout")), from_b64(r.get("stderr"))
        error = None
        if r.get("errorName"):
            error = ExecutionError(r.get("errorName", ""),
                                   r.get("errorValue", ""),
                                   r.get("traceback", ""))
        step = to_int(reply.get("stepIndex")) or None
        return cls(stdout=_text(out), stderr=_text(err),
                   result=r.get("result", "") if r.get("hasResult") else None,
                   error=error, step=step,
                   session_id=reply.get("sessionId") or None,
                   context=r.get("context") or "default",
                   language=r.get("language") or "python",
                   timed_out=bool(r.get("timedOut")),
                   context_created=bool(r.get("contextCreated")),
                   execution_count=to_int(r.get("executionCount")),
                   duration_us=to_int(r.get("durationUs")),
                   stdout_bytes=out, stderr_bytes=err,
                   recording_error=reply.get("recordingError", ""))


@dataclass
class CommandResult:
    """One finished command. `exit_code` is -1 when a signal killed it
    (`signal` says which); stdout/stderr are text, the *_bytes fields
    the exact bytes."""
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    signal: int = 0
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    step: Optional[int] = None
    session_id: Optional[str] = None
    recording_error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def _from_reply(cls, reply: Mapping[str, Any]) -> "CommandResult":
        st = reply.get("status") or {}
        out, err = from_b64(reply.get("stdout")), from_b64(reply.get("stderr"))
        return cls(exit_code=to_int(st.get("exitCode")), stdout=_text(out),
                   stderr=_text(err), stdout_bytes=out, stderr_bytes=err,
                   signal=to_int(st.get("signal")),
                   timed_out=bool(st.get("timedOut")),
                   stdout_truncated=bool(st.get("stdoutTruncated")),
                   stderr_truncated=bool(st.get("stderrTruncated")),
                   duration_ms=to_int(st.get("durationMs")),
                   step=to_int(reply.get("stepIndex")) or None,
                   session_id=reply.get("sessionId") or None,
                   recording_error=reply.get("recordingError", ""))


_FILE_TYPES = {"FILE_TYPE_REGULAR": "file", "FILE_TYPE_DIRECTORY": "dir",
               "FILE_TYPE_SYMLINK": "symlink", "FILE_TYPE_OTHER": "other",
               "FILE_TYPE_UNKNOWN": "unknown"}


@dataclass
class FileInfo:
    """A file in a sandbox; `type` is "file", "dir", "symlink", "other"
    or "unknown"."""
    name: str
    path: str
    size: int
    mode: int
    mtime_ns: int
    type: str

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def _from_json(cls, f: Mapping[str, Any]) -> "FileInfo":
        return cls(name=f.get("name", ""), path=f.get("path", ""),
                   size=to_int(f.get("size")), mode=to_int(f.get("mode")),
                   mtime_ns=to_int(f.get("mtimeNs")),
                   type=_FILE_TYPES.get(f.get("type", "FILE_TYPE_UNKNOWN"),
                                        "unknown"))


@dataclass
class Snapshot:
    """A snapshot of a running sandbox, held by its node. `location` is
    "ram" (its RAM copy in the node's RAM dir) or "disk" (evicted to the
    on-disk store, `evicted_to`; a restore rebuilds the RAM copy first);
    `session_id` and `step` say which recorded step it is of (step 0: the
    state before the first)."""
    id: str
    sandbox_id: str
    pause_ms: int
    ram_bytes: int
    disk_bytes: int
    created_unix_ms: int
    remote_stored: bool
    location: str = ""
    evicted_to: str = ""
    ram_resident_bytes: int = 0
    last_used_unix_ms: int = 0
    session_id: str = ""
    step: int = 0
    template: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def _from_json(cls, s: Mapping[str, Any]) -> "Snapshot":
        return cls(id=s.get("snapshotId", ""),
                   sandbox_id=s.get("sandboxId", ""),
                   pause_ms=to_int(s.get("pauseMs")),
                   ram_bytes=to_int(s.get("ramBytes")),
                   disk_bytes=to_int(s.get("diskBytes")),
                   created_unix_ms=to_int(s.get("createdUnixMs")),
                   remote_stored=bool(s.get("remoteStored")),
                   location=s.get("location", ""),
                   evicted_to=s.get("evictedTo", ""),
                   ram_resident_bytes=to_int(s.get("ramResidentBytes")),
                   last_used_unix_ms=to_int(s.get("lastUsedUnixMs")),
                   session_id=s.get("sessionId", ""),
                   step=to_int(s.get("step")),
                   template=bool(s.get("template")), raw=dict(s))


@dataclass
class GcResult:
    """What GcSnapshots removed (or, dry_run, would remove): `removed`
    holds one dict per snapshot (snapshot_id, where: "node NODE" or
    "snapd", bytes, sandbox_id); `kept` counts the snapshots a step
    still names; `errors` the nodes or snapd that failed."""
    dry_run: bool
    removed: List[Dict[str, Any]]
    bytes_freed: int
    kept: int
    errors: List[str]

    @classmethod
    def _from_json(cls, r: Mapping[str, Any]) -> "GcResult":
        removed = [{"snapshot_id": g.get("snapshotId", ""),
                    "where": g.get("where", ""),
                    "bytes": to_int(g.get("bytes")),
                    "sandbox_id": g.get("sandboxId", "")}
                   for g in r.get("removed", [])]
        return cls(dry_run=bool(r.get("dryRun")), removed=removed,
                   bytes_freed=to_int(r.get("bytesFreed")),
                   kept=to_int(r.get("kept")),
                   errors=list(r.get("errors", [])))


_STEP_KINDS = {"STEP_KIND_EXEC": "exec", "STEP_KIND_CODE": "code",
               "STEP_KIND_FILE_WRITE": "file_write",
               "STEP_KIND_SHELL": "shell"}


@dataclass
class Step:
    """One recorded step of a session: `kind` is "exec", "code",
    "file_write" or "shell" (a terminal session, its stdout an
    asciicast); `snapshot_id` is "" when no snapshot follows it (then
    it cannot be restored or forked from), and `snapshot_removed` says
    why when it had one (e.g. retention removed it); `keep`: pinned, so
    retention keeps its snapshot. A branch (after a restore or fork)
    continues its parent's numbering: its steps before the branch point
    are inherited, and `held_by_session` names the session that holds
    each ("" for the session's own steps)."""
    session_id: str
    index: int
    kind: str
    input: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    language: str = ""
    argv: List[str] = field(default_factory=list)
    path: str = ""
    snapshot_id: str = ""
    started_ms: int = 0
    ended_ms: int = 0
    safety: str = ""
    keep: bool = False
    snapshot_removed: str = ""
    held_by_session: str = ""

    @property
    def inherited(self) -> bool:
        """inherited: the step is a parent's, read along a branch's
        path."""
        return bool(self.held_by_session)

    @classmethod
    def _from_json(cls, s: Mapping[str, Any]) -> "Step":
        return cls(session_id=s.get("sessionId", ""),
                   index=to_int(s.get("index")),
                   kind=_STEP_KINDS.get(s.get("kind", ""), "unknown"),
                   input=s.get("input", ""),
                   exit_code=to_int(s.get("exitCode")),
                   stdout=from_b64(s.get("stdout")),
                   stderr=from_b64(s.get("stderr")),
                   language=s.get("language", ""),
                   argv=list(s.get("argv", [])), path=s.get("path", ""),
                   snapshot_id=s.get("snapshotId", ""),
                   started_ms=to_int(s.get("startedMs")),
                   ended_ms=to_int(s.get("endedMs")),
                   safety=s.get("safety", ""), keep=bool(s.get("keep")),
                   snapshot_removed=s.get("snapshotRemoved", ""),
                   held_by_session=s.get("heldBySession", ""))


@dataclass
class SessionTreeNode:
    """One session of a session tree (Client.session_tree): where it
    branched from its parent (`branched_at`, a step of the parent's
    path), its path's length (`step_count`), the steps it holds itself
    (`own_steps`, from `first_step`), the exit code of its last own step
    (None: it has none) and its depth under the tree's root (0)."""
    session_id: str
    parent_session_id: str = ""
    branched_at: int = 0
    depth: int = 0
    first_step: int = 1
    step_count: int = 0
    own_steps: int = 0
    last_exit_code: Optional[int] = None
    sandbox_id: str = ""
    created_ms: int = 0

    @classmethod
    def _from_json(cls, n: Mapping[str, Any]) -> "SessionTreeNode":
        return cls(session_id=n.get("sessionId", ""),
                   parent_session_id=n.get("parentSessionId", ""),
                   branched_at=to_int(n.get("branchedAt")),
                   depth=to_int(n.get("depth")),
                   first_step=to_int(n.get("firstStep")) or 1,
                   step_count=to_int(n.get("stepCount")),
                   own_steps=to_int(n.get("ownSteps")),
                   last_exit_code=(to_int(n.get("lastExitCode"))
                                   if n.get("hasExit") else None),
                   sandbox_id=n.get("sandboxId", ""),
                   created_ms=to_int(n.get("createdMs")))


@dataclass
class ForkFailure:
    """A copy of a fork that did not start, and why."""
    code: str
    message: str

    def error(self) -> MoatError:
        return error_for(self.code, self.message)


class ForkResult(list):
    """The sandboxes a Fork started (a list of Sandbox), with the copies
    that failed in `failed` and the snapshot forked from."""

    def __init__(self, sandboxes, failed, snapshot_id):
        super().__init__(sandboxes)
        self.failed: List[ForkFailure] = failed
        self.snapshot_id: str = snapshot_id


@dataclass
class Restored:
    """What RestoreStep brought back: the sandbox (same id when restored
    in place), the branch session recording from there, the snapshot."""
    sandbox_id: str
    session_id: str
    snapshot_id: str


# ---- the sandbox and its parts ----

class Commands:
    """sb.commands: processes in the sandbox (Exec)."""

    def __init__(self, sandbox: "Sandbox"):
        self._sb = sandbox

    def run(self, cmd: Union[str, Sequence[str]], cwd: Optional[str] = None,
            env: Optional[Mapping[str, str]] = None,
            timeout: Optional[float] = None,
            stdin: Union[bytes, str, None] = None,
            keep: bool = False) -> CommandResult:
        """run: runs `cmd` to the end. A string runs under /bin/sh, a list
        is the argv itself. `timeout` is seconds (None: the node's
        default); a command that runs past it is killed and comes back
        with timed_out set. A non-zero exit is a result, not an error.
        keep: pin the recorded step it becomes (snapshot retention then
        keeps its snapshot)."""
        body: Dict[str, Any] = {"sandboxId": self._sb.id}
        if isinstance(cmd, str):
            body["shell"] = cmd
        else:
            argv = [str(a) for a in cmd]
            if not argv:
                raise ValueError("commands.run: empty argv")
            body["argv"] = argv
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = [f"{k}={v}" for k, v in env.items()]
        if stdin is not None:
            body["stdin"] = to_b64(stdin.encode() if isinstance(stdin, str)
                                   else bytes(stdin))
        ms = _seconds_to_ms(timeout)
        if ms:
            body["timeoutMs"] = ms
        if keep:
            body["keep"] = True
        reply = self._sb._client.call("Exec", body, timeout=timeout)
        return CommandResult._from_reply(reply)


class Files:
    """sb.files: the sandbox's filesystem."""

    def __init__(self, sandbox: "Sandbox"):
        self._sb = sandbox

    def read(self, path: str) -> bytes:
        """read: the whole file at `path`, in as many ReadFile calls as
        it takes."""
        out = bytearray()
        while True:
            reply = self._sb._client.call("ReadFile", {
                "sandboxId": self._sb.id, "path": path,
                "offset": str(len(out))})
            piece = from_b64(reply.get("data"))
            out += piece
            size = to_int(reply.get("size"))
            if reply.get("eof") or not piece or len(out) >= size:
                return bytes(out)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """read_text: the file at `path` decoded as `encoding`."""
        return self.read(path).decode(encoding)

    def write(self, path: str, data: Union[bytes, str], mode: int = 0o644,
              make_parents: bool = True) -> FileInfo:
        """write: replaces the file at `path` with `data` (str is written
        as UTF-8), creating missing directories unless make_parents is
        False. Large data goes in pieces."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        data = bytes(data)
        offset, reply = 0, {}
        while True:
            piece = data[offset:offset + _WRITE_CHUNK]
            body: Dict[str, Any] = {"sandboxId": self._sb.id, "path": path,
                                    "data": to_b64(piece), "mode": mode,
                                    "makeParents": make_parents}
            if offset == 0:
                body["truncate"] = True
            else:
                body["offset"] = str(offset)
            reply = self._sb._client.call("WriteFile", body)
            offset += len(piece)
            if offset >= len(data):
                return FileInfo._from_json(reply)

    def list(self, path: str = "/", recursive: bool = False) -> List[FileInfo]:
        """list: the entries of directory `path`."""
        reply = self._sb._client.call("ListFiles", {
            "sandboxId": self._sb.id, "path": path, "recursive": recursive})
        return [FileInfo._from_json(f) for f in reply.get("entries", [])]

    def stat(self, path: str) -> FileInfo:
        """stat: what is at `path` (NotFound when nothing is)."""
        return FileInfo._from_json(self._sb._client.call("StatFile", {
            "sandboxId": self._sb.id, "path": path}))

    def exists(self, path: str) -> bool:
        """exists: whether anything is at `path`."""
        from .errors import NotFound
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def remove(self, path: str, recursive: bool = False) -> None:
        """remove: deletes `path` (a directory only with recursive)."""
        self._sb._client.call("RemoveFile", {
            "sandboxId": self._sb.id, "path": path, "recursive": recursive})

    def make_dir(self, path: str, parents: bool = True,
                 mode: int = 0o755) -> FileInfo:
        """make_dir: creates directory `path`."""
        return FileInfo._from_json(self._sb._client.call("MakeDir", {
            "sandboxId": self._sb.id, "path": path, "parents": parents,
            "mode": mode}))

    def _files_route(self) -> str:
        return f"/v1/sandboxes/{urllib.parse.quote(self._sb.id, safe='')}/files"

    def upload_dir(self, local_dir: str, remote_path: str,
                   timeout: Optional[float] = None) -> ArchiveSummary:
        """upload_dir: copies the contents of local directory
        `local_dir` into sandbox directory `remote_path` (made if
        missing) as one tar archive: packed into a temporary file first
        (memory stays bounded), then streamed to PUT
        .../files?archive=tar. The guest unpacks it only if every entry
        is safe, else nothing is written. Symlinks are copied as links.
        Returns an ArchiveSummary of what the sandbox wrote."""
        client = self._sb._client
        with pack_dir(local_dir) as tmp:
            size = os.fstat(tmp.fileno()).st_size
            resp = client.open_route(
                "PUT", self._files_route(),
                {"path": remote_path, "archive": "tar"}, data=tmp,
                headers={"Content-Type": "application/x-tar",
                         "Content-Length": str(size)},
                timeout=timeout, what="upload_dir")
            with resp:
                raw = resp.read()
        return summary_of(client.decode_reply(raw, "upload_dir"))

    def download_dir(self, remote_path: str, local_dir: str,
                     timeout: Optional[float] = None) -> ArchiveSummary:
        """download_dir: copies sandbox directory (or file)
        `remote_path` into local directory `local_dir` (made if
        missing): GET .../files?archive=tar into a temporary file, then
        unpacked only once every member passed the checks (no absolute
        or `..` names, no device nodes or fifos, no link out of
        local_dir, nothing under a symlink of the archive): a refused
        archive writes nothing. Symlinks are kept as links. Returns an
        ArchiveSummary of what was written."""
        client = self._sb._client
        with tempfile.TemporaryFile() as tmp:
            resp = client.open_route(
                "GET", self._files_route(),
                {"path": remote_path, "archive": "tar"},
                timeout=timeout, what="download_dir")
            want, got = None, 0
            with resp:
                want = resp.headers.get("Content-Length")
                try:
                    for block in iter(lambda: resp.read(1 << 20), b""):
                        tmp.write(block)
                        got += len(block)
                except (http.client.IncompleteRead, OSError):
                    pass  # a short body: reported below
            if want is not None and got != int(want):
                raise Unavailable(None, f"download_dir: the archive of "
                                  f"{remote_path} ended after {got} of "
                                  f"{want} bytes (the sandbox or the "
                                  f"gateway failed mid-way): nothing was "
                                  f"written; retry")
            tmp.seek(0)
            return unpack(tmp, local_dir)


def _seconds(value: Any, name: str) -> int:
    n = int(value)
    if n < 1 or n > 0xFFFFFFFF:
        raise ValueError(f"{name} must be whole seconds, 1 or more, "
                         f"not {value!r}")
    return n


def _network(network: Optional[str],
             allow: Optional[Sequence[str]]) -> Optional[Dict[str, Any]]:
    """_network: the CreateSandboxRequest.network JSON of network= and
    allow= (None: leave it unset, i.e. no network)."""
    if isinstance(allow, str):
        allow = [allow]
    entries = [str(a) for a in (allow or [])]
    if network is None:
        network = "allowlist" if entries else None
    if network is None:
        return None
    if network not in ("none", "allowlist"):
        raise ValueError(f"network must be 'none' or 'allowlist', "
                         f"not {network!r}")
    if network == "none" and entries:
        raise ValueError("allow= needs network='allowlist' (or leave "
                         "network unset)")
    return {"mode": network, "allow": entries}


class Sandbox:
    """A microVM. Sandbox(...) creates one (and waits until it runs);
    Sandbox.connect(id) attaches to one that exists. As a context manager
    it is destroyed on exit, whichever way it was obtained.

    cpus, memory (MiB): its shape (0: the node's default); image: a guest
    image name (None: "default"); labels: str -> str; record: keep a
    session of every command and code run (history, restore, fork);
    snapshot: "manual" (a step gets a snapshot when you call snapshot()),
    "every" (after each step) or "none"; network: "none" (the default: no
    network) or "allowlist"; allow: "host[:port]" names the guest may
    reach through the node's proxy (ports 80 and 443 when none is given;
    implies network="allowlist"; execs get http_proxy/https_proxy set);
    node_selector: str -> str labels a node must carry to be placed on
    (its [vmd] labels / --label; `moat node ls` shows them).
    timeout here is how long to wait for the boot; lifetime (seconds)
    is when the node destroys the sandbox (None: the tenant's default,
    [tenants] timeout-s), idle_timeout (seconds) destroys it after that
    long without a call (None: the tenant's default). Sandbox.create()
    takes them as timeout= and idle_timeout=."""

    def __init__(self, cpus: int = 1, memory: int = 512, record: bool = True,
                 snapshot: str = "manual", image: Optional[str] = None,
                 labels: Optional[Mapping[str, str]] = None,
                 client: Optional[Client] = None,
                 timeout: Optional[float] = None, cold_boot: bool = False,
                 network: Optional[str] = None,
                 allow: Optional[Sequence[str]] = None,
                 lifetime: Optional[int] = None,
                 idle_timeout: Optional[int] = None,
                 node_selector: Optional[Mapping[str, str]] = None):
        if snapshot not in _POLICIES:
            raise ValueError(f"snapshot must be one of "
                             f"{', '.join(sorted(_POLICIES))}, not "
                             f"{snapshot!r}")
        self._client = client or Client()
        body: Dict[str, Any] = {"vcpus": int(cpus), "memoryMib": int(memory),
                                "record": bool(record),
                                "snapshotPolicy": _POLICIES[snapshot]}
        if image:
            body["image"] = image
        if labels:
            body["labels"] = {str(k): str(v) for k, v in labels.items()}
        if cold_boot:
            body["coldBoot"] = True
        if node_selector:  # placement: only nodes with all these labels
            body["nodeSelector"] = {str(k): str(v)
                                    for k, v in node_selector.items()}
        net = _network(network, allow)
        if net is not None:
            body["network"] = net
        if timeout is not None:
            body["bootTimeoutMs"] = _seconds_to_ms(timeout)
        if lifetime is not None:
            body["timeoutS"] = _seconds(lifetime, "lifetime")
        if idle_timeout is not None:
            body["idleTimeoutS"] = _seconds(idle_timeout, "idle_timeout")
        self._set_info(self._client.call("CreateSandbox", body,
                                         timeout=timeout))
        self._init_parts()

    @classmethod
    def create(cls, timeout: Optional[int] = None,
               idle_timeout: Optional[int] = None,
               boot_timeout: Optional[float] = None,
               **kwargs: Any) -> "Sandbox":
        """create: Sandbox(**kwargs) that the node destroys `timeout`
        seconds from now (None: the tenant's default) or after
        `idle_timeout` seconds without a call (None: the tenant's
        default); boot_timeout: how long to wait for the boot."""
        return cls(lifetime=timeout, idle_timeout=idle_timeout,
                   timeout=boot_timeout, **kwargs)

    def _init_parts(self) -> None:
        self.commands = Commands(self)
        self.files = Files(self)

    def _set_info(self, info: Mapping[str, Any]) -> None:
        self.info: Dict[str, Any] = dict(info)
        self.id: str = info.get("id", "")
        self.session_id: Optional[str] = info.get("sessionId") or None

    @classmethod
    def _from_info(cls, client: Client, info: Mapping[str, Any]) -> "Sandbox":
        sb = cls.__new__(cls)
        sb._client = client
        sb._set_info(info)
        sb._init_parts()
        return sb

    @classmethod
    def connect(cls, sandbox_id: str,
                client: Optional[Client] = None) -> "Sandbox":
        """connect: the running sandbox `sandbox_id` (NotFound when this
        tenant has none by that id)."""
        client = client or Client()
        return cls._from_info(client, client.call(
            "GetSandbox", {"sandboxId": sandbox_id}))

    def __repr__(self) -> str:
        return f"<moat.Sandbox {self.id} session={self.session_id}>"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self.info.get("labels") or {})

    def refresh(self) -> "Sandbox":
        """refresh: re-reads the sandbox (state, session) from the
        gateway."""
        self._set_info(self._client.call("GetSandbox",
                                         {"sandboxId": self.id}))
        return self

    def kill(self) -> None:
        """kill: destroys the sandbox; one already gone is not an
        error."""
        from .errors import NotFound
        try:
            self._client.call("DestroySandbox", {"sandboxId": self.id})
        except NotFound:
            pass

    destroy = kill

    def set_timeout(self, timeout: Optional[int] = None,
                    idle_timeout: Optional[int] = None) -> "Sandbox":
        """set_timeout: the sandbox now expires `timeout` seconds from
        now; idle_timeout sets its idle timeout (0 removes it). Neither:
        the tenant's default timeout from now (a keepalive). Over the
        tenant's maximum: InvalidArgument naming it."""
        body: Dict[str, Any] = {"sandboxId": self.id}
        if timeout is not None:
            body["timeoutS"] = _seconds(timeout, "timeout")
        if idle_timeout is not None:
            if int(idle_timeout) == 0:
                body["clearIdleTimeout"] = True
            else:
                body["idleTimeoutS"] = _seconds(idle_timeout,
                                                "idle_timeout")
        self._set_info(self._client.call("SetTimeout", body))
        return self

    keepalive = set_timeout

    @property
    def expires_unix_ms(self) -> int:
        """When the node destroys the sandbox (0: never)."""
        return to_int(self.info.get("expiresUnixMs"))

    @property
    def idle_timeout(self) -> int:
        """Seconds without a call before it is destroyed (0: none)."""
        return to_int(self.info.get("idleTimeoutS"))

    def run_code(self, code: str, language: str = "python",
                 context: str = "default",
                 timeout: Optional[float] = None,
                 keep: bool = False) -> Execution:
        """run_code: runs `code` in the named persistent context (like a
        notebook cell: variables, imports and functions stay for the next
        run). An exception in the code is the result's `error`, not a
        raise; a timeout interrupts the cell and keeps the context.
        keep: pin the recorded step it becomes (retention keeps its
        snapshot)."""
        body: Dict[str, Any] = {"sandboxId": self.id, "code": code,
                                "language": language, "context": context}
        ms = _seconds_to_ms(timeout)
        if ms:
            body["timeoutMs"] = ms
        if keep:
            body["keep"] = True
        return Execution._from_reply(self._client.call("RunCode", body,
                                                       timeout=timeout))

    def close_context(self, context: str = "default") -> None:
        """close_context: ends a code context and frees its interpreter."""
        self._client.call("CloseCodeContext", {"sandboxId": self.id,
                                               "context": context})

    def snapshot(self) -> Snapshot:
        """snapshot: pauses the sandbox, snapshots it and resumes. With a
        recorded "manual" session it becomes the latest step's snapshot
        (so that step can be restored or forked from)."""
        return Snapshot._from_json(self._client.call(
            "SnapshotSandbox", {"sandboxId": self.id}))

    def _need_session(self, what: str) -> str:
        if not self.session_id:
            self.refresh()
        if not self.session_id:
            raise error_for("FAILED_PRECONDITION",
                            f"{what}: sandbox {self.id} is not recorded: "
                            f"create it with Sandbox(record=True)")
        return self.session_id

    def history(self, session_id: Optional[str] = None,
                outputs: bool = True) -> List[Step]:
        """history: the steps of this sandbox's session (or of
        `session_id`), oldest first, with their outputs unless outputs is
        False. After a restore or fork the session is a branch: its
        history starts with the steps it inherits up to the branch point
        (Step.inherited, Step.held_by_session), then its own, numbered
        on from there."""
        sid = session_id or self._need_session("history")
        steps: List[Step] = []
        token = ""
        while True:
            body: Dict[str, Any] = {"sessionId": sid,
                                    "includeOutputs": outputs}
            if token:
                body["pageToken"] = token
            reply = self._client.call("ListSteps", body)
            steps += [Step._from_json(s) for s in reply.get("steps", [])]
            token = reply.get("nextPageToken", "")
            if not token:
                return steps

    def tree(self, session_id: Optional[str] = None
             ) -> List["SessionTreeNode"]:
        """tree: the tree of this sandbox's session (or of
        `session_id`): it, then the branches made from it, depth first
        (Client.session_tree)."""
        sid = session_id or self._need_session("tree")
        return self._client.session_tree(sid)

    def keep_step(self, step: int, keep: bool = True,
                  session_id: Optional[str] = None) -> Step:
        """keep_step: pins recorded step `step` (from 1) of this
        sandbox's session (or of `session_id`) so snapshot retention
        keeps its snapshot; keep=False unpins it. Returns the step
        (without outputs)."""
        sid = session_id or self._need_session("keep_step")
        return Step._from_json(self._client.call("SetStepKeep", {
            "sessionId": sid, "index": str(int(step)), "keep": bool(keep)}))

    def restore(self, step: int,
                session_id: Optional[str] = None,
                node: Optional[str] = None,
                reseed: bool = False) -> Restored:
        """restore: brings this sandbox back, in place (same id), to the
        exact state after recorded step `step` of its session (or of
        `session_id`, e.g. the one before an earlier restore; 0: before
        the first step), from that step's snapshot. From then on it
        records into a new branch session (session_id changes). `node`:
        restore on that node (the sandbox then gets a new id there);
        None: the gateway's placement chooses. The code contexts' random
        generators (python's random, numpy.random, node's Math.random)
        come back as recorded, so the same draws follow, unless
        `reseed`: then they get new seeds, as every fork's copy does."""
        sid = session_id or self._need_session("restore")
        body: Dict[str, Any] = {"sessionId": sid, "step": str(int(step)),
                                "sandboxId": self.id}
        if node:
            body["node"] = str(node)
        if reseed:
            body["reseed"] = True
        reply = self._client.call("RestoreStep", body)
        sb = reply.get("sandbox") or {}
        if sb:
            self._set_info(sb)
        if reply.get("sessionId"):
            self.session_id = reply["sessionId"]
        return Restored(sandbox_id=sb.get("id", self.id),
                        session_id=reply.get("sessionId", ""),
                        snapshot_id=reply.get("snapshotId", ""))

    def fork(self, step: Optional[int] = None, count: int = 1,
             labels: Optional[Mapping[str, str]] = None,
             session_id: Optional[str] = None,
             node: Optional[str] = None) -> ForkResult:
        """fork: `count` (1..16) new sandboxes, each in the state after
        step `step` (None: the latest step) of this sandbox's session (or
        of `session_id`), each recording its own branch. Returns the ones
        that started (ForkResult, a list of Sandbox; destroy them when
        done); those that did not are in .failed. Raises only when none
        started. Each copy's code contexts get new random seeds, so
        copies that sample draw different numbers."""
        sid = session_id or self._need_session("fork")
        if step is None:
            steps = self.history(sid, outputs=False)
            if not steps:
                raise error_for("FAILED_PRECONDITION",
                                f"fork: session {sid} has no steps yet")
            step = steps[-1].index
        body: Dict[str, Any] = {"sessionId": sid, "step": str(int(step)),
                                "count": int(count)}
        if labels:
            body["labels"] = {str(k): str(v) for k, v in labels.items()}
        if node:  # every copy there; None: spread by placement
            body["node"] = str(node)
        reply = self._client.call("Fork", body)
        started, failed = [], []
        for copy in reply.get("copies", []):
            code = code_name(copy.get("code"))
            if code == "OK" and copy.get("sandbox"):
                sb = Sandbox._from_info(self._client, copy["sandbox"])
                if copy.get("sessionId"):
                    sb.session_id = copy["sessionId"]
                started.append(sb)
            else:
                failed.append(ForkFailure(code, copy.get("message", "")))
        if not started:
            if failed:
                raise failed[0].error()
            raise error_for("INTERNAL", f"fork of session {sid} step "
                            f"{step}: the gateway returned no copies")
        return ForkResult(started, failed, reply.get("snapshotId", ""))


def run_code(code: str, language: str = "python",
             timeout: Optional[float] = None,
             client: Optional[Client] = None, **sandbox_args) -> Execution:
    """run_code: runs `code` once in a throwaway sandbox (created, used,
    destroyed) and returns its Execution. sandbox_args go to Sandbox()."""
    sandbox_args.setdefault("record", False)
    sandbox_args.setdefault("snapshot", "none")
    with Sandbox(client=client, **sandbox_args) as sb:
        return sb.run_code(code, language=language, timeout=timeout)


def wait_ready(client: Optional[Client] = None, timeout: float = 30.0) -> dict:
    """wait_ready: waits until the gateway answers Info with an available
    node, and returns that ClusterInfo; raises Unavailable after
    `timeout` seconds."""
    client = client or Client()
    deadline = time.monotonic() + timeout
    last: Optional[Exception] = None
    while time.monotonic() < deadline:
        try:
            info = client.info()
            if any(n.get("available") for n in info.get("nodes", [])):
                return info
            last = None
        except MoatError as e:
            last = e
        time.sleep(0.2)
    raise error_for("UNAVAILABLE", f"no available node behind "
                    f"{client.url} after {timeout:g} s"
                    + (f": {last}" if last else ""))
