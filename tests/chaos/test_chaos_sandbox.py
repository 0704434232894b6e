"""Chaos: a tool that hangs and ignores SIGTERM; the sandbox helper killed mid-call.

Real components: the built-in ``python`` tool (retool's) in a real LocalSandbox
(namespaces, its own helper process), run through the real ToolExecutor. A hanging
program that ignores SIGTERM (and forks a child that does too) must end as a timeout
message the model reads, leave no process behind, and leave the sandbox usable. A
helper SIGKILLed while a call runs must end that call with a clear error at once (no
hang), and a new sandbox must work.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from agentrl.builtin_tools.python_interpreter import PythonInterpreter
from agentrl.sandbox.base import SandboxError
from agentrl.sandbox.local import LocalSandbox
from agentrl.tools.executor import ToolExecutor
from agentrl.types import ToolCall
from tests.chaos.harness import ChaosRecord

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(300)]

HANG = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("{marker}", flush=True)
time.sleep(10**6)
"""


def _of_uid(uid: int) -> list[int]:
    """Live host processes whose real uid is ``uid`` (a sandbox's code runs as its own uid;
    its command line need not show the code: warm Python forks the sandbox's helper)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                out.append(int(name))
    return out


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(name))
    return out


def _call(code: str) -> ToolCall:
    return ToolCall("python", {"code": code}, "call_0")


async def _hang_case(rec: ChaosRecord) -> None:
    marker = f"chaos-{uuid.uuid4().hex}"
    async with LocalSandbox() as sb:
        executor = ToolExecutor([PythonInterpreter(sb, timeout_s=2.0)], timeout_s=30.0)
        t0 = time.monotonic()
        res = await executor.run([_call(HANG.format(marker=marker))])
        took = time.monotonic() - t0
        text = res.messages[0].content
        await asyncio.sleep(0.5)
        left = _of_uid(sb.uid)
        after = await executor.run([_call("print(6 * 7)")])
        rec.recovery_s = round(took, 1)
        rec.leaks = [f"process {p}" for p in left]
        rec.detail = f"tool answered in {took:.1f}s: {text[:120]!r}"
        assert "timed out" in text.lower() or "timeout" in text.lower(), text
        assert took < 15, f"the call took {took:.1f}s for a 2s timeout"
        assert not left, f"processes of the hung tool survived: {left}"
        assert after.messages[0].content.strip().startswith("42"), after.messages[0].content
    rec.outcome = "timed out, sandbox reused"
    rec.episodes_lost = rec.duplicated = rec.steps_lost = 0


def test_tool_that_hangs_and_ignores_sigterm():
    rec = ChaosRecord("tool-hangs-ignores-sigterm", "python tool")
    try:
        asyncio.run(_hang_case(rec))
    finally:
        if rec.outcome == "unknown":
            rec.outcome = "failed"
        rec.write()


async def _helper_case(rec: ChaosRecord) -> None:
    marker = f"chaos-{uuid.uuid4().hex}"
    sb = LocalSandbox()
    await sb.start()
    try:
        executor = ToolExecutor([PythonInterpreter(sb, timeout_s=60.0)], timeout_s=90.0)
        call = asyncio.create_task(
            executor.run([_call(f"import time\nprint('{marker}')\ntime.sleep(60)")])
        )
        deadline = time.monotonic() + 20
        while not _of_uid(sb.uid):
            assert time.monotonic() < deadline, "the call never started"
            await asyncio.sleep(0.1)
        assert sb._proc is not None
        helpers = _children(sb._proc.pid)
        assert helpers, "no helper process under unshare"
        t0 = time.monotonic()
        for pid in helpers:
            os.kill(pid, signal.SIGKILL)
        res = await asyncio.wait_for(call, 30)
        took = time.monotonic() - t0
        text = res.messages[0].content
        rec.recovery_s = round(took, 1)
        rec.detail = f"tool answered {took:.1f}s after the kill: {text[:160]!r}"
        assert text.startswith("error:") and "sandbox" in text.lower(), text
        assert took < 10, f"the call hung {took:.1f}s after its helper died"
        assert not sb.alive
        with pytest.raises(SandboxError):
            await sb.exec(["true"])
    finally:
        await sb.close()
        await sb.close()  # idempotent
    await asyncio.sleep(0.5)
    left = _of_uid(sb.uid)
    rec.leaks = [f"process {p}" for p in left]
    assert not left, f"processes of the call survived its helper: {left}"
    async with LocalSandbox() as fresh:  # a new sandbox works
        out = await fresh.run_code("print(6 * 7)", language="python", timeout_s=30)
        assert out.stdout.strip() == "42", out
    rec.outcome = "clear error, new sandbox works"
    rec.episodes_lost = rec.duplicated = rec.steps_lost = 0


def test_sandbox_helper_killed_mid_call():
    rec = ChaosRecord("sandbox-helper-killed-mid-call", "python tool")
    try:
        asyncio.run(_helper_case(rec))
    finally:
        if rec.outcome == "unknown":
            rec.outcome = "failed"
        rec.write()
