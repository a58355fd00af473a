"""What every adapter shares: a plain callable (code: str) -> str that
runs Python in a moat sandbox and formats the outcome as text a model
reads. Not for: any framework's types."""

from __future__ import annotations

import importlib
from typing import Callable, Optional

from ..client import Client
from ..sandbox import Execution, Sandbox, run_code

DESCRIPTION = ("Run Python code in an isolated moat microVM sandbox and "
               "get back its stdout, stderr, the value of the last "
               "expression, or the error it raised.")


def format_execution(ex: Execution) -> str:
    """format_execution: one Execution as text for a model: the streams,
    the last expression's value, and the traceback when it raised."""
    parts = []
    if ex.stdout:
        parts.append(ex.stdout.rstrip("\n"))
    if ex.stderr:
        parts.append("[stderr]\n" + ex.stderr.rstrip("\n"))
    if ex.result is not None:
        parts.append(ex.result)
    if ex.error is not None:
        parts.append(ex.error.traceback.rstrip("\n") or str(ex.error))
    return "\n".join(parts) if parts else "(no output)"


def code_runner(sandbox: Optional[Sandbox] = None,
                client: Optional[Client] = None, context: str = "default",
                timeout: Optional[float] = None) -> Callable[[str], str]:
    """code_runner: a function run_python(code) -> str. With `sandbox`,
    every call runs in that sandbox's persistent context (state carries
    over; the caller destroys the sandbox); without, each call gets a
    throwaway sandbox."""

    def run_python(code: str) -> str:
        """Run Python code in an isolated sandbox; returns its output,
        the value of the last expression, or the traceback."""
        if sandbox is not None:
            ex = sandbox.run_code(code, context=context, timeout=timeout)
        else:
            ex = run_code(code, timeout=timeout, client=client)
        return format_execution(ex)

    return run_python


def require(module: str, package: str, adapter: str):
    """require: imports `module`, or raises ImportError saying which pip
    package the adapter needs."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{adapter} needs the `{package}` package, which is not "
            f"installed ({e}): pip install {package}") from e
