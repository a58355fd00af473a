"""moat: the Python SDK of moat (disposable microVM sandboxes for AI
agents). Standard library only; talks to moat-gateway's HTTP/JSON API
($MOAT_URL, default http://127.0.0.1:7780).

    import moat
    print(moat.run_code("6*7").result)          # '42'
    with moat.Sandbox() as sb:
        sb.run_code("x = 1"); sb.run_code("x + 1").result   # '2'
"""

from .archive import ArchiveSummary
from .client import Client
from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss,
                     DeadlineExceeded, FailedPrecondition, Internal,
                     InvalidArgument, MoatError, NotFound, OutOfRange,
                     PermissionDenied, ResourceExhausted, Unauthenticated,
                     Unavailable, Unimplemented, Unknown)
from .sandbox import (CommandResult, Execution, ExecutionError, FileInfo,
                      ForkFailure, ForkResult, GcResult, Restored, Sandbox,
                      SessionTreeNode, Snapshot, Step, run_code, wait_ready)

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "run_code", "wait_ready", "Execution",
    "ExecutionError", "CommandResult", "FileInfo", "Snapshot", "Step",
    "GcResult", "ArchiveSummary", "SessionTreeNode",
    "Restored", "ForkResult", "ForkFailure", "MoatError", "Cancelled",
    "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented",
    "Internal", "Unavailable", "DataLoss", "Unauthenticated",
]
