"""Images through the gateway (issue 17): `client.images.list()` and
`client.images.build(spec_path, name=None)`, which starts a build on a
node and yields its steps as they come (long polls of GetImageBuild).
Only a spec's [files] section is read here, to send the files it names
(SOURCE[:MODE], relative to the spec's directory); the builder checks
the rest. Not for: building without a gateway (images/build.sh)."""

from __future__ import annotations

import configparser
import os
from typing import Any, Dict, Iterator, List, Optional

from .client import to_b64
from .errors import InvalidArgument, code_name, error_for

_POLL_WAIT_MS = 10000
_FILES_MAX = 32 << 20


def _spec_files(spec_path: str, text: str) -> List[Dict[str, Any]]:
    parser = configparser.ConfigParser(interpolation=None, strict=False,
                                       delimiters=("=",))
    parser.optionxform = str  # keys are paths in the image: keep case
    try:
        parser.read_string(text, source=spec_path)
    except configparser.Error as e:
        raise InvalidArgument(None, f"spec {spec_path}: not INI: {e}")
    if not parser.has_section("files"):
        return []
    base, files, total = os.path.dirname(spec_path) or ".", [], 0
    for dest, value in parser.items("files"):
        src, _, mode = value.partition(":")
        if not src or src.startswith("/") or ".." in src:
            raise InvalidArgument(None, f"spec {spec_path}: [files] {dest}"
                                  f" = {value}: SOURCE must be a path "
                                  f"relative to the spec's directory")
        path = os.path.join(base, src)
        try:
            with open(path, "rb") as f:
                data = f.read()
            st = os.stat(path)
        except OSError as e:
            raise InvalidArgument(None, f"spec {spec_path}: [files] "
                                  f"{dest}: {path}: {e.strerror}") from None
        total += len(data)
        if total > _FILES_MAX:
            raise InvalidArgument(None, f"spec {spec_path}: the files sent "
                                  f"with a build are over 32 MiB together")
        try:
            m = int(mode, 8) if mode else st.st_mode & 0o7777
        except ValueError:
            raise InvalidArgument(None, f"spec {spec_path}: [files] {dest}"
                                  f": mode {mode!r} is not octal") from None
        files.append({"name": src, "data": to_b64(data), "mode": m})
    return files


class Images:
    """The image calls of one Client (client.images)."""

    def __init__(self, client):
        self._client = client

    def list(self, name: Optional[str] = None) -> List[Dict[str, Any]]:
        """list: every image (or the one named) as ImageInfo dicts: name,
        id, sizeBytes, packages, nodes (holding it), stored (in
        moat-snapd)."""
        reply = self._client.call("ListImages", {"name": name or ""})
        return reply.get("images", [])

    def build(self, spec_path: str, name: Optional[str] = None,
              force: bool = False,
              node: Optional[str] = None) -> Iterator[Dict[str, Any]]:
        """build: builds the spec at `spec_path` as image `name` (default:
        the file's name without .ini) and yields each step ({"text",
        "atMs"}) as the builder reports it; the generator's return value
        (StopIteration.value) is the ImageBuild once done. A failed build
        raises the MoatError of its code with the builder's message."""
        with open(spec_path, encoding="utf-8") as f:
            text = f.read()
        if name is None:
            name = os.path.basename(spec_path)
            if name.endswith(".ini"):
                name = name[:-4]
        body = {"name": name, "spec": text, "force": bool(force),
                "nodeId": node or "",
                "files": _spec_files(spec_path, text)}
        b = self._client.call("StartImageBuild", body)
        ref = {"buildId": b.get("id", ""), "nodeId": b.get("nodeId", ""),
               "fromStep": 0, "waitMs": _POLL_WAIT_MS}
        while True:
            b = self._client.call("GetImageBuild", ref,
                                  timeout=_POLL_WAIT_MS / 1000)
            for step in b.get("steps", []):
                yield step
            ref["fromStep"] = int(b.get("nextStep", ref["fromStep"]))
            state = b.get("state", "")
            if state == "IMAGE_BUILD_FAILED":
                raise error_for(code_name(int(b.get("code", 2))),
                                f"building image {name}: "
                                f"{b.get('error', '')}", None)
            if state == "IMAGE_BUILD_DONE":
                return b

