"""ToolExecutor: bounded concurrency, per-turn limit, timeouts, errors as messages, metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentrl.tools import ToolExecutor, ToolRegistry, tool
from agentrl.tools.executor import METRIC_KEYS
from agentrl.types import Message, ToolCall


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool
async def explode(message: str) -> str:
    """Always fails."""
    raise ValueError(message)


@tool
async def nap(seconds: float) -> str:
    """Sleeps."""
    await asyncio.sleep(seconds)
    return "rested"


@tool
def shout(text: str, times: int) -> str:
    """Repeats text."""
    return text * times


def calls(*specs: tuple[str, dict[str, Any]]) -> list[ToolCall]:
    return [ToolCall(name, args, f"call_{i}") for i, (name, args) in enumerate(specs)]


def counts(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics without the timing, and only the non-zero ones."""
    return {k: v for k, v in metrics.items() if v and k != "tool_time_s"}


async def test_results_in_call_order_with_ids_and_names() -> None:
    ex = ToolExecutor([add, nap])
    res = await ex.run(calls(("nap", {"seconds": 0.05}), ("add", {"a": 1, "b": 2})))
    assert res.messages == (
        Message.tool("rested", tool_call_id="call_0", name="nap"),
        Message.tool("3", tool_call_id="call_1", name="add"),
    )
    assert set(res.metrics) == set(METRIC_KEYS)
    assert counts(res.metrics) == {"tool_calls": 2}
    assert res.metrics["tool_time_s"] > 0


async def test_concurrency_is_bounded_by_max_parallel() -> None:
    running = peak = 0

    @tool
    async def probe() -> str:
        """Counts how many run at once."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return "ok"

    ex = ToolExecutor([probe], max_parallel=3, max_calls_per_turn=10)
    res = await ex.run(calls(*[("probe", {})] * 10))
    assert [m.content for m in res.messages] == ["ok"] * 10
    assert peak == 3  # parallel, and never more than the bound


async def test_calls_over_the_per_turn_limit_are_answered_not_run() -> None:
    ran: list[int] = []

    @tool
    def mark(i: int) -> str:
        """Records that it ran."""
        ran.append(i)
        return f"ran {i}"

    ex = ToolExecutor([mark], max_calls_per_turn=2)
    res = await ex.run(calls(*[("mark", {"i": i}) for i in range(5)]))
    assert sorted(ran) == [0, 1]
    assert [m.content for m in res.messages] == [
        "ran 0",
        "ran 1",
        "error: call 3 not run: at most 2 tool calls per turn",
        "error: call 4 not run: at most 2 tool calls per turn",
        "error: call 5 not run: at most 2 tool calls per turn",
    ]
    assert [m.tool_call_id for m in res.messages] == [f"call_{i}" for i in range(5)]
    assert counts(res.metrics) == {
        "tool_calls": 5,
        "tool_dropped_over_limit": 3,
        "tool_errors": 3,
    }


async def test_timeout_becomes_a_message_and_returns_promptly() -> None:
    ex = ToolExecutor([nap, add], timeout_s=0.1)
    t0 = time.monotonic()
    res = await ex.run(calls(("nap", {"seconds": 30}), ("add", {"a": 2, "b": 2})))
    assert time.monotonic() - t0 < 5
    assert [m.content for m in res.messages] == ["error: tool 'nap' timed out after 0.1s", "4"]
    assert counts(res.metrics) == {"tool_calls": 2, "tool_timeouts": 1, "tool_errors": 1}


async def test_sync_tool_timeout_does_not_block_the_loop() -> None:
    @tool
    def block(seconds: float) -> str:
        """Blocks its thread."""
        time.sleep(seconds)
        return "done"

    ex = ToolExecutor([block], timeout_s=0.05)
    res = await ex.run(calls(("block", {"seconds": 0.3})))
    assert res.messages[0].content == "error: tool 'block' timed out after 0.05s"


async def test_tool_raising_timeout_error_itself_is_an_exception_not_a_timeout() -> None:
    @tool
    async def flaky() -> str:
        """Its own backend timed out."""
        raise TimeoutError("backend slow")

    res = await ToolExecutor([flaky]).run(calls(("flaky", {})))
    assert res.messages[0].content == "error: tool 'flaky' raised TimeoutError: backend slow"
    assert counts(res.metrics) == {"tool_calls": 1, "tool_exceptions": 1, "tool_errors": 1}


async def test_exceptions_unknown_tools_and_bad_arguments_become_messages() -> None:
    ex = ToolExecutor(ToolRegistry([add, explode]))
    res = await ex.run(
        calls(
            ("explode", {"message": "boom"}),
            ("missing", {}),
            ("add", {"a": "x", "b": 1}),
            ("add", {"a": 1, "b": 1}),
        )
    )
    assert [m.content for m in res.messages] == [
        "error: tool 'explode' raised ValueError: boom",
        "error: unknown tool 'missing'; available tools: add, explode",
        "error: bad arguments for tool 'add': a: Input should be a valid integer, "
        "unable to parse string as an integer (got 'x')",
        "2",
    ]
    assert [m.name for m in res.messages] == ["explode", "missing", "add", "add"]
    assert counts(res.metrics) == {
        "tool_calls": 4,
        "tool_exceptions": 1,
        "tool_unknown": 1,
        "tool_bad_args": 1,
        "tool_errors": 3,
    }


async def test_parse_errors_are_reported_after_the_calls() -> None:
    res = await ToolExecutor({"add": add}).run(
        calls(("add", {"a": 1, "b": 1})), parse_errors=["tool call 2: invalid JSON"]
    )
    assert res.messages == (
        Message.tool("2", tool_call_id="call_0", name="add"),
        Message.tool("error: tool call 2: invalid JSON"),
    )
    assert counts(res.metrics) == {"tool_calls": 1, "tool_parse_errors": 1, "tool_errors": 1}


async def test_long_output_is_truncated_with_a_marker() -> None:
    ex = ToolExecutor([shout], max_output_chars=10)
    res = await ex.run(
        calls(("shout", {"text": "x", "times": 100}), ("shout", {"text": "y", "times": 10}))
    )
    assert [m.content for m in res.messages] == ["x" * 10 + "\n…[truncated 90 chars]", "y" * 10]
    assert counts(res.metrics) == {"tool_calls": 2, "tool_truncated": 1}


async def test_any_tool_protocol_implementation_works() -> None:
    class Upper:
        name = "upper"
        description = "Upper-cases text."

        def schema(self) -> dict[str, Any]:
            return {"type": "function", "function": {"name": self.name}}

        async def call(self, arguments: dict[str, Any]) -> str:
            return str(arguments["text"]).upper()

    res = await ToolExecutor([Upper()]).run(calls(("upper", {"text": "hi"})))
    assert res.messages[0].content == "HI"


async def test_cancelling_the_run_cancels_the_tools() -> None:
    ex = ToolExecutor([nap], timeout_s=60)
    task = asyncio.create_task(ex.run(calls(("nap", {"seconds": 60}))))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        ToolExecutor([add], max_parallel=0)
    with pytest.raises(ValueError):
        ToolExecutor([add], timeout_s=0)
    with pytest.raises(ValueError, match="already registered"):
        ToolExecutor([add, add])


async def test_each_call_has_a_record_with_its_latency_and_failure() -> None:
    ex = ToolExecutor([add, nap, explode], timeout_s=1.0)
    res = await ex.run(
        calls(
            ("nap", {"seconds": 0.2}),
            ("add", {"a": 1, "b": 2}),
            ("explode", {"message": "no"}),
            ("nap", {"seconds": 5}),
            ("nope", {}),
        ),
        parse_errors=["bad json"],
    )
    recs = res.calls
    assert len(recs) == len(res.messages) == 6
    assert [(r.id, r.name, r.error) for r in recs] == [
        ("call_0", "nap", None),
        ("call_1", "add", None),
        ("call_2", "explode", "tool_exceptions"),
        ("call_3", "nap", "tool_timeouts"),
        ("call_4", "nope", "tool_unknown"),
        (None, "", "tool_parse_errors"),
    ]
    assert 0.2 <= recs[0].latency_s < 1.0  # the nap's own time, not the turn's
    assert recs[1].latency_s < 0.5
    assert 1.0 <= recs[3].latency_s < 2.0  # cut at the timeout
    assert recs[4].latency_s == recs[5].latency_s == 0.0  # never ran
    assert recs[0].output_chars == len("rested") and recs[1].output_chars == 1
