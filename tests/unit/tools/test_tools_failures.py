"""Tools that could kill or freeze the run: each ends one call with a message the model sees.

SystemExit / KeyboardInterrupt / other BaseExceptions from a tool, sync tools stuck past
their timeout (their own bounded pool, apart from env and trainer work), and tool output
that cannot be tokenized (lone surrogates).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentrl.tools import ToolExecutor, tool
from agentrl.tools import threads as tool_threads
from agentrl.tools.sanitize import scrub_messages, scrub_text
from agentrl.tools.threads import ToolThreads
from agentrl.types import Message, ToolCall


def calls(*specs: tuple[str, dict[str, Any]]) -> list[ToolCall]:
    return [ToolCall(name, args, f"call_{i}") for i, (name, args) in enumerate(specs)]


class Abort(BaseException):
    """A custom BaseException a library might raise."""


@tool
def cli(argv: str) -> str:
    """Runs an argparse command line (exits on bad input, as argparse does)."""
    parser = argparse.ArgumentParser(prog="cli", exit_on_error=False)
    parser.add_argument("--n", type=int, required=True)
    return str(parser.parse_args(argv.split()).n * 2)


@tool
async def async_exit(code: int) -> str:
    """Calls sys.exit from a coroutine."""
    sys.exit(code)


@tool
def interrupt() -> str:
    """Raises KeyboardInterrupt from its thread."""
    raise KeyboardInterrupt


@tool
async def abort() -> str:
    """Raises a custom BaseException."""
    raise Abort("stop everything")


@tool
async def self_cancel() -> str:
    """Raises CancelledError without anyone cancelling it."""
    raise asyncio.CancelledError


@tool
async def nap(seconds: float) -> str:
    """Sleeps."""
    await asyncio.sleep(seconds)
    return "rested"


async def test_base_exceptions_from_tools_become_error_messages() -> None:
    ex = ToolExecutor([cli, async_exit, interrupt, abort, self_cancel])
    res = await ex.run(
        calls(
            ("cli", {"argv": "--n 3"}),
            ("cli", {"argv": "--bogus"}),  # argparse: print usage, SystemExit(2)
            ("async_exit", {"code": 3}),
            ("interrupt", {}),
            ("abort", {}),
            ("self_cancel", {}),
        )
    )
    texts = [m.content for m in res.messages]
    assert texts[0] == "6"
    assert texts[1] == "error: tool 'cli' raised SystemExit: 2"
    assert texts[2] == "error: tool 'async_exit' raised SystemExit: 3"
    assert texts[3] == "error: tool 'interrupt' raised KeyboardInterrupt"
    assert texts[4] == "error: tool 'abort' raised Abort: stop everything"
    assert texts[5].startswith("error: tool 'self_cancel' raised CancelledError")
    assert res.metrics["tool_exceptions"] == 5 and res.metrics["tool_errors"] == 5
    # The executor (and the loop) still work after all that.
    assert (await ex.run(calls(("cli", {"argv": "--n 1"})))).messages[0].content == "2"


async def test_real_cancellation_still_propagates() -> None:
    ex = ToolExecutor([nap])
    task = asyncio.create_task(ex.run(calls(("nap", {"seconds": 30}))))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_agent_loop_episode_survives_a_tool_calling_sys_exit(tokenizer: Any) -> None:
    from agentrl import StopReason
    from agentrl.rollout import AgentLoop
    from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
    from tests.helpers.agent_loop import AddEnv, tool_then_answer

    class ExitingAdd(AddEnv):
        @tool
        def add(self, a: int, b: int) -> int:
            """Adds, badly."""
            raise SystemExit(2)

    def policy(prompt: str) -> str:
        return "ANSWER 3" if "<tool_response>" in prompt else tool_then_answer(prompt)

    llm = ScriptedLLM(TextPolicy(tokenizer, policy))
    traj = await AgentLoop(llm, tokenizer).run(ExitingAdd(), {"a": 1, "b": 2})
    assert traj.stop_reason == StopReason.DONE, traj.error  # the model answered after it
    tool_msgs = [m.content for m in traj.messages if m.role == "tool"]
    assert tool_msgs == ["error: tool 'add' raised SystemExit: 2"]
    assert traj.metrics["tool_exceptions"] == 1


# --------------------------------------------------------------------------- stuck threads


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[ToolThreads]:
    """A 2-thread tool pool for the test, in place of the process-wide one."""
    pool = ToolThreads(2)
    monkeypatch.setattr(tool_threads, "_default", pool)
    yield pool


async def test_stuck_sync_tools_do_not_starve_env_or_trainer_work(
    small_pool: ToolThreads,
) -> None:
    release = threading.Event()

    @tool
    def hang() -> str:
        """Blocks until the test releases it (a tool that never returns)."""
        release.wait(60)
        return "finally"

    @tool
    def quick() -> str:
        """A sync tool that returns at once."""
        return "quick"

    loop = asyncio.get_running_loop()
    default = concurrent.futures.ThreadPoolExecutor(max_workers=2)  # env/trainer's pool
    loop.set_default_executor(default)
    try:
        ex = ToolExecutor([hang, quick], timeout_s=0.2)
        res = await ex.run(calls(("hang", {}), ("hang", {})))
        assert [m.content for m in res.messages] == ["error: tool 'hang' timed out after 0.2s"] * 2
        # env.reset/step and the trainer step (asyncio.to_thread) still run at once.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 5) == 42
        assert res.metrics["tool_threads_left_running"] == 2
        assert small_pool.stuck == 2 and small_pool.running == 2
        stuck = [t for t in threading.enumerate() if t.name == "agentrl-tool-hang"]
        assert len(stuck) == 2 and all(t.daemon for t in stuck)  # never blocks process exit
        # Every tool thread is stuck: sync tools fail at once with a clear message (an
        # executor with a 30 s timeout answers well before it; the bound holds on a busy CI).
        t0 = time.perf_counter()
        res = await ToolExecutor([hang, quick], timeout_s=30).run(calls(("quick", {})))
        assert time.perf_counter() - t0 < 5
        assert "all 2 tool threads are stuck" in res.messages[0].content
        assert res.metrics["tool_exceptions"] == 1
        # When the stuck calls return, their threads come back.
        release.set()
        for _ in range(100):
            if small_pool.running == 0:
                break
            await asyncio.sleep(0.02)
        assert small_pool.stuck == 0
        assert (await ex.run(calls(("quick", {})))).messages[0].content == "quick"
    finally:
        release.set()
        default.shutdown(wait=False)


def test_a_stuck_tool_thread_does_not_keep_the_process_alive() -> None:
    script = textwrap.dedent(
        """
        import asyncio, threading, time
        from agentrl.tools import ToolExecutor, tool
        from agentrl.types import ToolCall

        @tool
        def hang() -> str:
            '''Never returns.'''
            threading.Event().wait()
            return ""

        res = asyncio.run(ToolExecutor([hang], timeout_s=0.2).run([ToolCall("hang", {}, "c")]))
        print(res.messages[0].content, flush=True)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "error: tool 'hang' timed out after 0.2s"


# ------------------------------------------------------------------------- bad text


def test_scrub_text_replaces_lone_surrogates_and_joins_pairs() -> None:
    assert scrub_text("plain ✓") == ("plain ✓", 0)
    assert scrub_text("a\udc00b\ud800") == ("a\ufffdb\ufffd", 2)
    assert scrub_text("\ud83d\ude00 and \ufffd") == ("😀 and \ufffd", 0)
    msgs, n = scrub_messages([Message.user("ok"), Message.tool("x\udcff", name="t\udc80")])
    assert n == 2 and msgs[0] == Message.user("ok")
    assert msgs[1] == Message.tool("x\ufffd", name="t\ufffd")
    for m in msgs:
        m.content.encode("utf-8")


async def test_tool_output_that_cannot_be_encoded_is_replaced_and_counted() -> None:
    @tool
    def echo_bytes() -> str:
        """Echoes undecodable bytes the way os.fsdecode does."""
        return b"caf\xe9 \xff".decode("utf-8", "surrogateescape")

    res = await ToolExecutor([echo_bytes]).run(calls(("echo_bytes", {})))
    assert res.messages[0].content == "caf\ufffd \ufffd"
    assert res.metrics["tool_text_replaced"] == 2 and res.metrics["tool_errors"] == 0


async def test_agent_loop_episode_survives_surrogates_from_tools_and_env(tokenizer: Any) -> None:
    from agentrl import StopReason
    from agentrl.rollout import AgentLoop
    from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
    from tests.helpers.agent_loop import AddEnv, tool_then_answer

    class SurrogateAdd(AddEnv):
        def reset(self, task: Any, *, seed: int | None = None) -> Any:
            msgs = super().reset(task, seed=seed)
            return [Message.system("Use tools.\udc00"), *msgs[1:]]

        @tool
        def add(self, a: int, b: int) -> str:
            """Adds, with a stray surrogate."""
            return f"{a + b}\udc00"

    llm = ScriptedLLM(TextPolicy(tokenizer, tool_then_answer))
    traj = await AgentLoop(llm, tokenizer).run(SurrogateAdd(), {"a": 1, "b": 2})
    assert traj.stop_reason == StopReason.DONE, traj.error
    assert [m.content for m in traj.messages if m.role == "tool"] == ["3\ufffd"]
    assert traj.messages[0].content == "Use tools.\ufffd"
    assert traj.metrics["tool_text_replaced"] == 1 and traj.metrics["env_text_replaced"] == 1
