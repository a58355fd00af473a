"""Typed errors of the moat SDK: one class per status code of
proto/common.proto's Code, each carrying the code's name, the gateway's
message and the HTTP status it came with. Not for: retry policy (callers
decide) or transport details beyond the message."""

from __future__ import annotations

from typing import Dict, Optional, Type


class MoatError(Exception):
    """A failed moat call: `code` is the status name ("NOT_FOUND"),
    `message` the gateway's text, `http_status` the HTTP status (None when
    no HTTP reply came at all)."""

    code = "UNKNOWN"

    def __init__(self, code: Optional[str], message: str,
                 http_status: Optional[int] = None):
        if code:
            self.code = code
        self.message = message
        self.http_status = http_status
        super().__init__(f"{self.code}: {message}")

    def __reduce__(self):
        return (self.__class__, (self.code, self.message, self.http_status))


class Cancelled(MoatError):
    code = "CANCELLED"


class Unknown(MoatError):
    code = "UNKNOWN"


class InvalidArgument(MoatError):
    code = "INVALID_ARGUMENT"


class DeadlineExceeded(MoatError):
    code = "DEADLINE_EXCEEDED"


class NotFound(MoatError):
    code = "NOT_FOUND"


class AlreadyExists(MoatError):
    code = "ALREADY_EXISTS"


class PermissionDenied(MoatError):
    code = "PERMISSION_DENIED"


class ResourceExhausted(MoatError):
    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(MoatError):
    code = "FAILED_PRECONDITION"


class Aborted(MoatError):
    code = "ABORTED"


class OutOfRange(MoatError):
    code = "OUT_OF_RANGE"


class Unimplemented(MoatError):
    code = "UNIMPLEMENTED"


class Internal(MoatError):
    code = "INTERNAL"


class Unavailable(MoatError):
    code = "UNAVAILABLE"


class DataLoss(MoatError):
    code = "DATA_LOSS"


class Unauthenticated(MoatError):
    code = "UNAUTHENTICATED"


ERRORS_BY_CODE: Dict[str, Type[MoatError]] = {
    cls.code: cls
    for cls in (Cancelled, Unknown, InvalidArgument, DeadlineExceeded,
                NotFound, AlreadyExists, PermissionDenied,
                ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
                Unimplemented, Internal, Unavailable, DataLoss,
                Unauthenticated)
}

# What a reply without a JSON error body (a proxy's, say) most likely means.
_CODE_BY_HTTP_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED", 404: "NOT_FOUND", 405: "UNIMPLEMENTED",
    409: "ABORTED", 412: "FAILED_PRECONDITION", 413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 501: "UNIMPLEMENTED",
    502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}

# gRPC's numbering, for codes that arrive as numbers (ForkCopy.code with
# enums written as ints).
_CODE_NAMES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
               "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
               "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
               "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
               "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
               "UNAUTHENTICATED"]


def code_name(code) -> str:
    """code_name: a Code as its name, whether it came as a name, a number
    or not at all (proto3 JSON leaves OK out)."""
    if code is None or code == "":
        return "OK"
    if isinstance(code, int):
        return _CODE_NAMES[code] if 0 <= code < len(_CODE_NAMES) else "UNKNOWN"
    return str(code)


def error_for(code: Optional[str], message: str,
              http_status: Optional[int] = None) -> MoatError:
    """error_for: the typed exception for a status name; an unknown or
    missing name is guessed from the HTTP status, else UNKNOWN."""
    if not code and http_status is not None:
        code = _CODE_BY_HTTP_STATUS.get(http_status,
                                        "INTERNAL" if http_status >= 500
                                        else "UNKNOWN")
    cls = ERRORS_BY_CODE.get(code or "UNKNOWN", MoatError)
    return cls(code or "UNKNOWN", message, http_status)
