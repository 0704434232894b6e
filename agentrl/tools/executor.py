"""ToolExecutor: runs one turn's tool calls concurrently, bounded, each under a timeout.

Every call — and every malformed call the parser reported — becomes exactly one
tool message the model sees; failures are counted in metrics, never raised.

Example:
    >>> import asyncio
    >>> from agentrl.tools import tool
    >>> from agentrl.types import ToolCall
    >>> @tool
    ... def add(a: int, b: int) -> int:
    ...     '''Adds two integers.'''
    ...     return a + b
    >>> result = asyncio.run(ToolExecutor([add]).run([ToolCall("add", {"a": 1, "b": 2}, "call_0")]))
    >>> result.messages[0].content, result.metrics["tool_errors"]
    ('3', 0.0)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agentrl.tools.base import Tool, ToolArgumentError, to_text
from agentrl.tools.registry import ToolRegistry
from agentrl.tools.sanitize import scrub_text
from agentrl.types import Message, ToolCall

__all__ = ["METRIC_KEYS", "ToolCallRecord", "ToolExecutor", "ToolRunResult"]

log = logging.getLogger(__name__)

METRIC_KEYS = (
    "tool_calls",  # well-formed calls the model made (run or not)
    "tool_errors",  # messages that report a failure, all causes together
    "tool_timeouts",
    "tool_unknown",
    "tool_bad_args",
    "tool_parse_errors",
    "tool_exceptions",
    "tool_dropped_over_limit",
    "tool_truncated",
    "tool_text_replaced",  # lone surrogates replaced in tool output (see tools.sanitize)
    "tool_threads_left_running",  # timed-out sync tools whose thread runs on (tools.threads)
    "tool_time_s",  # wall time of the whole turn's tool work
)


@dataclass(frozen=True)
class ToolCallRecord:
    """What one tool call did, for the trajectory (and ``agentrl view --web``).

    Attributes:
        id: The call's id (as the model's turn gave it; None if it had none).
        name: The tool's name as called.
        latency_s: Wall time from the call's start (after waiting for a parallel
            slot) to its result; 0.0 for calls that never ran (unknown tool,
            over the per-turn limit, malformed).
        error: The failure's metric name (e.g. ``"tool_timeouts"``), None if it worked.
        output_chars: Characters of the result before truncation.
    """

    id: str | None
    name: str
    latency_s: float
    error: str | None
    output_chars: int


@dataclass(frozen=True)
class ToolRunResult:
    """The outcome of one turn's tool calls.

    Attributes:
        messages: One tool message per call, in call order, then one per parse error.
        metrics: Counts keyed by :data:`METRIC_KEYS`.
        calls: One record per message, in the same order (parse errors as name "").
    """

    messages: tuple[Message, ...]
    metrics: dict[str, float] = field(default_factory=dict)
    calls: tuple[ToolCallRecord, ...] = ()


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """Cuts ``text`` to ``max_chars`` characters plus a marker saying how many were cut."""
    if len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}\n…[truncated {len(text) - max_chars} chars]", True


def _really_cancelled(e: BaseException) -> bool:
    """Whether ``e`` carries a cancellation of the running task (vs. one a tool raised)."""
    if isinstance(e, BaseExceptionGroup):
        if e.subgroup(asyncio.CancelledError) is None:
            return False
    elif not isinstance(e, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class ToolExecutor:
    """Runs tool calls against a fixed set of tools.

    Args:
        tools: The tools the model may call (a ToolRegistry, a name → Tool mapping
            or an iterable of tools with unique names).
        max_parallel: Most calls running at once.
        max_calls_per_turn: Calls beyond this many in one turn are not run; each
            gets an error message saying so.
        timeout_s: Wall-clock limit of one call (from when it starts running).
            A sync tool that overruns keeps its thread (one of the bounded pool of
            :mod:`agentrl.tools.threads`, apart from env and trainer work) until it returns.
        max_output_chars: Longer outputs are cut, with a marker.
    """

    def __init__(
        self,
        tools: ToolRegistry | Mapping[str, Tool] | Iterable[Tool],
        *,
        max_parallel: int = 4,
        max_calls_per_turn: int = 8,
        timeout_s: float = 30.0,
        max_output_chars: int = 4096,
    ) -> None:
        if max_parallel < 1 or max_calls_per_turn < 1:
            raise ValueError("max_parallel and max_calls_per_turn must be at least 1")
        if not timeout_s > 0 or max_output_chars < 1:
            raise ValueError("timeout_s and max_output_chars must be positive")
        if isinstance(tools, ToolRegistry):
            self.tools = tools
        elif isinstance(tools, Mapping):
            self.tools = ToolRegistry(tools.values())
        else:
            self.tools = ToolRegistry(tools)
        self.max_parallel = max_parallel
        self.max_calls_per_turn = max_calls_per_turn
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars

    async def run(
        self, calls: Sequence[ToolCall], parse_errors: Sequence[str] = ()
    ) -> ToolRunResult:
        """Runs ``calls`` and reports ``parse_errors``; never raises for a tool's failure."""
        t0 = time.perf_counter()
        metrics = dict.fromkeys(METRIC_KEYS, 0.0)
        metrics["tool_calls"] = float(len(calls))
        sem = asyncio.Semaphore(self.max_parallel)
        to_run = calls[: self.max_calls_per_turn]
        outcomes = await asyncio.gather(*(self._run_one(c, sem, metrics) for c in to_run))
        texts: list[tuple[ToolCall | None, str, str | None, float]] = [
            (c, text, kind, dt) for c, (text, kind, dt) in zip(to_run, outcomes, strict=True)
        ]
        for i, c in enumerate(calls[self.max_calls_per_turn :], start=self.max_calls_per_turn):
            limit = self.max_calls_per_turn
            msg = f"error: call {i + 1} not run: at most {limit} tool calls per turn"
            texts.append((c, msg, "tool_dropped_over_limit", 0.0))
        texts.extend((None, f"error: {e}", "tool_parse_errors", 0.0) for e in parse_errors)

        messages, records = [], []
        for call, text, kind, dt in texts:
            name = "" if call is None else call.name
            call_id = None if call is None else call.id
            records.append(ToolCallRecord(call_id, name, dt, kind, len(text)))
            if kind is not None:
                metrics[kind] += 1
                metrics["tool_errors"] += 1
            text, cut = truncate(text, self.max_output_chars)
            metrics["tool_truncated"] += cut
            text, replaced = scrub_text(text)
            metrics["tool_text_replaced"] += replaced
            if call is None:
                messages.append(Message.tool(text))
            else:
                messages.append(Message.tool(text, tool_call_id=call.id, name=call.name))
        metrics["tool_time_s"] = time.perf_counter() - t0
        return ToolRunResult(tuple(messages), metrics, tuple(records))

    async def _run_one(
        self, call: ToolCall, sem: asyncio.Semaphore, metrics: dict[str, float]
    ) -> tuple[str, str | None, float]:
        """(message text, metric name of the failure or None, seconds the call ran)."""
        if call.name not in self.tools:
            names = ", ".join(self.tools.names) or "(none)"
            msg = f"error: unknown tool {call.name!r}; available tools: {names}"
            return msg, "tool_unknown", 0.0
        async with sem:
            t0 = time.perf_counter()
            text, kind = await self._call(call, metrics)
            return text, kind, time.perf_counter() - t0

    async def _call(self, call: ToolCall, metrics: dict[str, float]) -> tuple[str, str | None]:
        """Runs one known tool: (message text, metric name of the failure or None)."""
        tool = self.tools.get(call.name)
        try:
            async with asyncio.timeout(self.timeout_s) as cm:
                out = await tool.call(call.arguments)
            return (out if isinstance(out, str) else to_text(out)), None
        except ToolArgumentError as e:
            return f"error: {e}", "tool_bad_args"
        except TimeoutError as e:
            if cm.expired():
                if getattr(tool, "runs_in_thread", False):
                    metrics["tool_threads_left_running"] += 1
                return (
                    f"error: tool {call.name!r} timed out after {self.timeout_s:g}s",
                    "tool_timeouts",
                )
            return self._exception(call, e)
        except asyncio.CancelledError as e:
            if _really_cancelled(e):
                raise  # the episode's timeout, a shutdown: not the tool's doing
            return self._exception(call, e)
        except GeneratorExit:
            raise
        except BaseException as e:
            # Whatever else a tool raises is its failure, the model's to see: SystemExit
            # (argparse, sys.exit), KeyboardInterrupt (a tool thread cannot receive a
            # real one; a real Ctrl-C reaches the run as its main task's cancellation),
            # custom BaseException subclasses, groups of these.
            if isinstance(e, BaseExceptionGroup) and _really_cancelled(e):
                raise
            return self._exception(call, e)

    @staticmethod
    def _exception(call: ToolCall, e: BaseException) -> tuple[str, str]:
        log.debug("tool %r raised", call.name, exc_info=e)
        try:
            text = str(e)
        except Exception:  # a broken __str__ must not break the report
            text = ""
        detail = f"{type(e).__name__}: {text}" if text else type(e).__name__
        return f"error: tool {call.name!r} raised {detail}", "tool_exceptions"
