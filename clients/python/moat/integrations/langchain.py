"""A LangChain tool that runs Python in a moat sandbox. langchain_core is
imported only when sandbox_tool() is called."""

from __future__ import annotations

from typing import Optional

from ..client import Client
from ..sandbox import Sandbox
from ._common import DESCRIPTION, code_runner, require


def sandbox_tool(sandbox: Optional[Sandbox] = None,
                 client: Optional[Client] = None, name: str = "run_python",
                 description: str = DESCRIPTION, context: str = "default",
                 timeout: Optional[float] = None):
    """sandbox_tool: a langchain_core StructuredTool taking `code`. With
    `sandbox`, state persists across calls in its context; without, each
    call uses a throwaway sandbox. ImportError (naming the package) when
    langchain-core is not installed."""
    tools = require("langchain_core.tools", "langchain-core",
                    "moat.integrations.langchain")
    func = code_runner(sandbox, client=client, context=context,
                       timeout=timeout)
    return tools.StructuredTool.from_function(func=func, name=name,
                                              description=description)
