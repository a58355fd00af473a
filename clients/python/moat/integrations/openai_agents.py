"""A function tool for the OpenAI Agents SDK that runs Python in a moat
sandbox. `agents` is imported only when sandbox_tool() is called."""

from __future__ import annotations

from typing import Optional

from ..client import Client
from ..sandbox import Sandbox
from ._common import DESCRIPTION, code_runner, require


def sandbox_tool(sandbox: Optional[Sandbox] = None,
                 client: Optional[Client] = None, name: str = "run_python",
                 description: str = DESCRIPTION, context: str = "default",
                 timeout: Optional[float] = None):
    """sandbox_tool: an agents.function_tool taking `code`. With
    `sandbox`, state persists across calls in its context; without, each
    call uses a throwaway sandbox. ImportError (naming the package) when
    openai-agents is not installed."""
    agents = require("agents", "openai-agents",
                     "moat.integrations.openai_agents")
    func = code_runner(sandbox, client=client, context=context,
                       timeout=timeout)
    return agents.function_tool(func, name_override=name,
                                description_override=description)
