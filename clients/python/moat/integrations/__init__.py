"""Optional adapters that hand a moat sandbox to agent frameworks as a
tool. Each imports its framework only when called, so `import moat`
never needs them. Not for: framework code of our own."""

from ._common import code_runner, format_execution

__all__ = ["code_runner", "format_execution"]
