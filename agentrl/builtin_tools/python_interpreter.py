"""The ``python`` tool: runs model-written Python in a Sandbox and shows what it printed.

Output format (compact, for small models to learn): stdout, then stderr, then one
bracketed status line when the run did not end normally::

    42
    Traceback (most recent call last):
      ...
    ZeroDivisionError: division by zero
    [exit code 1]

A run that printed nothing and succeeded gives ``[no output]``.

Example:
    >>> import asyncio
    >>> from agentrl.sandbox.base import ExecResult
    >>> class EchoSandbox:  # a stand-in for LocalSandbox
    ...     async def run_code(self, code, *, language="python", timeout_s=None):
    ...         return ExecResult(stdout="4\\n", stderr="", exit_code=0)
    >>> py = PythonInterpreter(EchoSandbox())
    >>> py.name, py.schema()["function"]["parameters"]["required"]
    ('python', ['code'])
    >>> asyncio.run(py.call({"code": "print(2 + 2)"}))
    '4'
"""

from __future__ import annotations

import signal

from agentrl.sandbox.base import ExecResult, Sandbox
from agentrl.tools.base import FunctionTool

__all__ = ["PythonInterpreter", "format_exec_result"]


def format_exec_result(result: ExecResult, *, timeout_s: float | None = None) -> str:
    """Renders an :class:`ExecResult` as the compact text the model reads."""
    parts = [s.rstrip() for s in (result.stdout, result.stderr) if s.strip()]
    if result.timed_out:
        limit = timeout_s if timeout_s is not None else result.duration_s
        parts.append(f"[timed out after {limit:g}s]")
    elif result.exit_code < 0:
        try:
            sig = signal.Signals(-result.exit_code).name
        except ValueError:
            sig = str(-result.exit_code)
        parts.append(f"[killed by signal {sig}]")
    elif result.exit_code != 0:
        parts.append(f"[exit code {result.exit_code}]")
    return "\n".join(parts) if parts else "[no output]"


class PythonInterpreter(FunctionTool):
    """The ``python`` tool, bound to one Sandbox (typically one per episode).

    Args:
        sandbox: Where the code runs.
        timeout_s: Wall-clock limit per run; None uses the sandbox's own limit.
    """

    def __init__(self, sandbox: Sandbox, *, timeout_s: float | None = None) -> None:
        self.sandbox = sandbox
        self.timeout_s = timeout_s
        super().__init__(self._python, name="python")

    async def _python(self, code: str) -> str:
        """Runs a Python program and returns its printed output and errors.

        Each call starts a fresh interpreter: define everything you use, and print
        the values you want to see.

        Args:
            code: The complete Python program to run.
        """
        result = await self.sandbox.run_code(code, language="python", timeout_s=self.timeout_s)
        return format_exec_result(result, timeout_s=self.timeout_s)
