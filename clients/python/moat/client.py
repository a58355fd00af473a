"""The HTTP transport of the moat SDK: one Client per gateway, calling
every Gateway method as POST /v1/rpc/{Method} with a proto3-JSON body and
turning error replies into typed exceptions (errors.py). Also the small
proto3-JSON helpers (64-bit integers arrive as strings, bytes as base64).
Not for: sandbox objects (sandbox.py) or anything stateful beyond the
address and key."""

from __future__ import annotations

import base64
import errno
import json
import os
import random
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional

from .errors import DeadlineExceeded, MoatError, Unavailable, error_for

DEFAULT_URL = "http://127.0.0.1:7780"
DEFAULT_TIMEOUT = 300.0

# Seconds added to an operation's own timeout (an exec's, a code run's):
# the call's deadline at the gateway must outlast the operation (else the
# gateway kills it and answers DEADLINE_EXCEEDED instead of a timed-out
# result), and the socket must outlast the deadline.
_DEADLINE_MARGIN = 10.0
_SOCKET_MARGIN = 30.0


def to_int(value: Any) -> int:
    """to_int: a proto3-JSON integer (a number, a decimal string for
    64-bit fields, or absent for 0) as an int."""
    if value is None or value == "":
        return 0
    return int(value)


def from_b64(value: Optional[str]) -> bytes:
    """from_b64: proto3-JSON bytes (standard or URL-safe base64, padded
    or not; absent for empty) as bytes."""
    if not value:
        return b""
    value = value.replace("-", "+").replace("_", "/")
    return base64.b64decode(value + "=" * (-len(value) % 4))


def to_b64(data: bytes) -> str:
    """to_b64: bytes as proto3-JSON base64 (standard alphabet, padded)."""
    return base64.b64encode(data).decode("ascii")


class Client:
    """A connection to one moat-gateway over HTTP. `url` defaults to
    $MOAT_URL, else http://127.0.0.1:7780; `api_key` to $MOAT_API_KEY
    (sent as `Authorization: Bearer KEY`); `timeout` is the socket timeout
    of one call in seconds. An https:// url is checked against `ca` (a PEM
    file of trusted CAs; default $MOAT_TLS_CA, else the system's CAs).
    Thread-safe: it keeps no per-call state."""

    def __init__(self, url: Optional[str] = None,
                 api_key: Optional[str] = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 ca: Optional[str] = None):
        url = url or os.environ.get("MOAT_URL") or DEFAULT_URL
        if "://" not in url:
            url = "http://" + url
        self.url = url.rstrip("/")
        self.api_key = (api_key if api_key is not None
                        else os.environ.get("MOAT_API_KEY") or None)
        self.timeout = timeout
        self.ca = ca or os.environ.get("MOAT_TLS_CA") or None
        self._ssl: Optional[ssl.SSLContext] = None
        if self.url.startswith("https://"):
            self._ssl = ssl.create_default_context(cafile=self.ca)

    def __repr__(self) -> str:
        return f"moat.Client({self.url!r})"

    def call(self, method: str, body: Optional[Dict[str, Any]] = None,
             timeout: Optional[float] = None) -> Dict[str, Any]:
        """call: runs Gateway method `method` (as named in
        proto/gateway.proto) with `body` (proto3 JSON, lowerCamelCase)
        and returns the reply message as a dict. `timeout` (seconds) is
        the operation's own timeout: the call's deadline at the gateway
        (X-Moat-Timeout-Ms) is a little longer, the socket's longer
        still. Raises a MoatError subclass on any failure."""
        data = json.dumps(body or {}).encode("utf-8")
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            # The idempotency key of mutating calls: one per call.
            "X-Moat-Request-Id": str(random.getrandbits(63) or 1),
        }
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        sock_timeout = self.timeout
        if timeout is not None:
            headers["X-Moat-Timeout-Ms"] = str(
                int((timeout + _DEADLINE_MARGIN) * 1000))
            sock_timeout = max(sock_timeout, timeout + _SOCKET_MARGIN)
        url = f"{self.url}/v1/rpc/{urllib.parse.quote(method)}"
        req = urllib.request.Request(url, data=data, headers=headers,
                                     method="POST")
        return self._send(req, method, sock_timeout)

    def open_route(self, http_method: str, path: str,
                   query: Dict[str, str], data: Any = None,
                   headers: Optional[Dict[str, str]] = None,
                   timeout: Optional[float] = None, what: str = ""):
        """open_route: one request to a REST route of the door (`path`
        under the gateway's url, `query` its arguments) whose body is
        `data` (bytes or a file object; give Content-Length in
        `headers` for a file) and whose reply the caller reads as it
        comes: the open response (close it). Errors are raised as
        call's, named `what`."""
        hdrs = dict(headers or {})
        if self.api_key:
            hdrs["Authorization"] = "Bearer " + self.api_key
        sock_timeout = self.timeout
        if timeout is not None:
            hdrs["X-Moat-Timeout-Ms"] = str(
                int((timeout + _DEADLINE_MARGIN) * 1000))
            sock_timeout = max(sock_timeout, timeout + _SOCKET_MARGIN)
        url = (f"{self.url}{path}?"
               f"{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}")
        req = urllib.request.Request(url, data=data, headers=hdrs,
                                     method=http_method)
        return self._open(req, what or path, sock_timeout)

    def _open(self, req: urllib.request.Request, method: str,
              timeout: float):
        try:
            return urllib.request.urlopen(req, timeout=timeout,
                                          context=self._ssl)
        except urllib.error.HTTPError as e:
            raise self._error_of(e.code, e.read(), method) from None
        except urllib.error.URLError as e:
            raise self._unreachable(e.reason, method) from None
        except (socket.timeout, TimeoutError):
            raise self._timed_out(method, timeout) from None
        except (ConnectionError, OSError) as e:
            raise self._unreachable(e, method) from None

    def _timed_out(self, method: str, timeout: float) -> MoatError:
        return DeadlineExceeded(
            None, f"{method}: no answer from the moat gateway at "
            f"{self.url} within {timeout:g} s")

    def _send(self, req: urllib.request.Request, method: str,
              timeout: float) -> Dict[str, Any]:
        with self._open(req, method, timeout) as resp:
            try:
                raw = resp.read()
            except (socket.timeout, TimeoutError):
                raise self._timed_out(method, timeout) from None
            except (ConnectionError, OSError) as e:
                raise self._unreachable(e, method) from None
            status = resp.status
        return self.decode_reply(raw, method, status)

    def decode_reply(self, raw: bytes, method: str,
                     status: int = 200) -> Dict[str, Any]:
        """decode_reply: a reply body as the JSON object it must be."""
        if not raw:
            return {}
        try:
            out = json.loads(raw)
        except ValueError:
            raise MoatError("INTERNAL", f"{method}: the gateway at "
                            f"{self.url} answered something that is not "
                            f"JSON: {raw[:200]!r}", status) from None
        if not isinstance(out, dict):
            raise MoatError("INTERNAL", f"{method}: the gateway answered "
                            f"a JSON {type(out).__name__}, not an object",
                            status)
        return out

    def _error_of(self, status: int, raw: bytes, method: str) -> MoatError:
        code, message = None, ""
        try:
            obj = json.loads(raw)
            if isinstance(obj, dict):
                code = obj.get("code")
                message = obj.get("message") or ""
        except ValueError:
            message = raw[:500].decode("utf-8", "replace").strip()
        if not message:
            message = f"HTTP {status} from {self.url}"
        return error_for(code, f"{method}: {message}", status)

    def _unreachable(self, reason: Any, method: str) -> MoatError:
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return DeadlineExceeded(None, f"{method}: no answer from the "
                                    f"moat gateway at {self.url}")
        if isinstance(reason, ssl.SSLError):
            return Unavailable(None, f"{method}: the TLS handshake with "
                               f"the moat gateway at {self.url} failed "
                               f"({reason}): give the CA that signed its "
                               f"certificate (ca= or MOAT_TLS_CA), and a "
                               f"url whose host its certificate names")
        refused = (isinstance(reason, ConnectionRefusedError) or
                   getattr(reason, "errno", None) == errno.ECONNREFUSED)
        what = "connection refused" if refused else str(reason)
        return Unavailable(None, f"{method}: cannot reach the moat gateway "
                           f"at {self.url} ({what}): start the local stack "
                           f"with `deploy/moat-stack start`, or set MOAT_URL "
                           f"to a running gateway")

    # ---- cluster calls ----

    def health(self) -> Dict[str, Any]:
        """health: the gateway's HealthReply as a dict."""
        return self.call("Health", {})

    def info(self) -> Dict[str, Any]:
        """info: ClusterInfo (version, nodes, services) as a dict."""
        return self.call("Info", {})

    def session_tree(self, session_id: str):
        """session_tree: session `session_id` and the branches made from
        it (restores, forks), depth first, as SessionTreeNode objects:
        where each branched, its step count, its last exit status."""
        from .sandbox import SessionTreeNode
        reply = self.call("GetSessionTree", {"sessionId": str(session_id)})
        return [SessionTreeNode._from_json(n)
                for n in reply.get("nodes", [])]

    def list_snapshots(self):
        """list_snapshots: this tenant's snapshots on every node, as
        Snapshot objects (where each lives, its session and step)."""
        from .sandbox import Snapshot
        reply = self.call("ListLocalSnapshots", {})
        return [Snapshot._from_json(s) for s in reply.get("snapshots", [])]

    def gc_snapshots(self, dry_run: bool = False,
                     min_age: Optional[int] = None):
        """gc_snapshots: removes this tenant's snapshots that no step
        names and whose sandbox is gone, on every node and in moat-snapd
        (dry_run: only lists them); those younger than `min_age` seconds
        (None: 60) are spared. Returns a GcResult."""
        from .sandbox import GcResult
        body: Dict[str, Any] = {"dryRun": bool(dry_run)}
        if min_age is not None:
            body["minAgeS"] = int(min_age)
        return GcResult._from_json(self.call("GcSnapshots", body))

    @property
    def images(self):
        """images: the image calls (images.py): list(), build()."""
        from .images import Images
        return Images(self)

    def list_sandboxes(self):
        """list_sandboxes: this tenant's sandboxes as Sandbox objects
        (connected, not created)."""
        from .sandbox import Sandbox
        reply = self.call("ListSandboxes", {})
        return [Sandbox._from_info(self, s)
                for s in reply.get("sandboxes", [])]
