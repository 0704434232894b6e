"""A Sandbox double that runs each exec as a host process (in the test's directories)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from agentrl.sandbox.base import ExecResult


class HostSandbox:
    """A Sandbox double: each exec is a host process, killed at its timeout; calls recorded."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        assert isinstance(cmd, list) and timeout_s is not None and timeout_s > 0
        self.calls.append({"argv": cmd, "timeout_s": timeout_s, "env": env})
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return ExecResult("", "", -9, timed_out=True)
        except asyncio.CancelledError:
            proc.kill()
            await proc.wait()
            raise
        return ExecResult(out.decode(), err.decode(), proc.returncode or 0)
