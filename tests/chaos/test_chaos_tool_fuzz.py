"""Chaos: ≥ 5,000 mutated tool-call strings through the real parser and executor.

Truncated, nested and huge JSON, unicode, NUL bytes and lone surrogates, 100 calls in
one turn, unknown tools, wrong types, tools that raise, overrun or return 50 MB.
Every string must parse without raising, every call must end as exactly one tool
message the model can read (bounded, valid UTF-8), and the process's memory must
not grow with the number of strings. Fast: part of the unit tier as well.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from typing import Any

import pytest

from agentrl.chat.parsers import get_parser
from agentrl.tools import tool
from agentrl.tools.executor import ToolExecutor
from tests.chaos.harness import ChaosRecord

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

N_STRINGS = 5200
MAX_OUT = 2048


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool
def echo(text: str, times: int = 1) -> str:
    """Repeats text."""
    return text * max(0, min(times, 1000))


@tool
def blob(megabytes: float) -> str:
    """Returns a string of about this many megabytes (at most 50)."""
    return "x" * int(min(max(megabytes, 0.0), 50.0) * 1_000_000)


@tool
async def nap(seconds: float) -> str:
    """Sleeps (async) and says so."""
    await asyncio.sleep(min(max(seconds, 0.0), 5.0))
    return "slept"


@tool
def boom(kind: str) -> str:
    """Raises what it is told to."""
    if kind == "exit":
        raise SystemExit(3)
    if kind == "kbd":
        raise KeyboardInterrupt
    if kind == "recursion":
        raise RecursionError("deep")
    if kind == "badstr":

        class Weird(Exception):
            def __str__(self) -> str:
                raise RuntimeError("no str")

        raise Weird
    raise ValueError(kind)


@tool
def shape(obj: dict[str, Any], items: list[int] | None = None) -> str:
    """Describes a nested object."""
    return f"{len(obj)} keys, {len(items or [])} items"


TOOLS = [add, echo, blob, nap, boom, shape]
NAMES = ["add", "echo", "blob", "nap", "boom", "shape"]

WEIRD = [
    "\x00",
    "\ud800",
    "\udfff",
    "\u202e",
    "\u200b",
    "\ufeff",
    "😀",
    "\U0010ffff",
    "𝕏",
    "é",
    "\n",
    "\\",
    '"',
    "\t",
    "</tool_call>",
    "<tool_call>",
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\x7f",
    "\x1b[2J",
]
VALUES: list[Any] = [
    0, -1, 2**63, 1e308, -0.0, True, None, "", "1", "x" * 300, [], {}, [1, "a"],
    {"a": {"b": [None]}}, "NaN", 3.5, "\x00", "😀",
]  # fmt: skip


def _valid(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(NAMES)
    table: dict[str, dict[str, Any]] = {
        "add": {"a": rng.randint(-9, 9), "b": rng.randint(-9, 9)},
        "echo": {"text": rng.choice(["hi", "ü", "\x00x"]), "times": rng.randint(0, 5)},
        "blob": {"megabytes": rng.choice([0, 0.001, 0.5])},
        "nap": {"seconds": rng.choice([0, 0.001])},
        "boom": {"kind": rng.choice(["value", "exit", "kbd", "recursion", "badstr"])},
        "shape": {"obj": {"k": [1, 2]}, "items": [1, 2, 3]},
    }
    args = table[name]
    return {"name": name, "arguments": args}


def _wrap(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def _mutate(rng: random.Random, kind: int) -> str:
    call = _valid(rng)
    body = json.dumps(call, ensure_ascii=rng.random() < 0.5)
    if kind == 0:  # truncated anywhere
        text = _wrap(body)
        return text[: rng.randint(0, len(text))]
    if kind == 1:  # random characters inserted
        chars = list(body)
        for _ in range(rng.randint(1, 8)):
            chars.insert(rng.randint(0, len(chars)), rng.choice(WEIRD))
        return _wrap("".join(chars))
    if kind == 2:  # deep nesting, in the body or inside the arguments
        depth = rng.choice([50, 500, 5000, 100_000])
        if rng.random() < 0.5:
            nest = "[" * depth + "]" * depth
        else:
            nest = '{"a":' * depth + "1" + "}" * depth
        if rng.random() < 0.5:
            return _wrap(nest)
        return _wrap(f'{{"name": "shape", "arguments": {{"obj": {{"x": {nest}}}}}}}')
    if kind == 3:  # wrong types
        call["arguments"] = {k: rng.choice(VALUES) for k in call["arguments"]}
        if rng.random() < 0.3:
            call["arguments"] = rng.choice(VALUES)
        if rng.random() < 0.2:
            call["name"] = rng.choice(VALUES)
        return _wrap(json.dumps(call))
    if kind == 4:  # unknown tools, odd names
        call["name"] = rng.choice(["rm", "", " ", "add ", "ADD", "a" * 5000, "😀", "\x00", "..."])
        return _wrap(json.dumps(call))
    if kind == 5:  # many calls in one turn, some broken
        parts = []
        for _ in range(rng.choice([20, 100, 101])):
            c = json.dumps(_valid(rng))
            parts.append(_wrap(c if rng.random() < 0.8 else c[: len(c) // 2]))
        return "thinking " + "".join(parts) + " done"
    if kind == 6:  # huge JSON: big strings, big numbers, many keys
        pick = rng.randrange(4)
        if pick == 0:
            return _wrap(json.dumps({"name": "echo", "arguments": {"text": "y" * 2_000_000}}))
        if pick == 1:
            return _wrap('{"name": "add", "arguments": {"a": ' + "9" * 6000 + ', "b": 1}}')
        if pick == 2:
            keys = {f"k{i}": i for i in range(20_000)}
            return _wrap(json.dumps({"name": "shape", "arguments": {"obj": keys}}))
        return _wrap('{"name": "add", "arguments": {"a": 1e999, "b": NaN}}')
    if kind == 7:  # arguments as a JSON string (valid, broken, nested twice)
        inner = json.dumps(call["arguments"])
        call["arguments"] = rng.choice([inner, inner[:-1], json.dumps(inner), "", "null"])
        return _wrap(json.dumps(call))
    if kind == 8:  # tags: nested, unclosed, closing only, other markup
        return rng.choice(
            [
                _wrap(_wrap(body)),
                "<tool_call>" + body,
                body + "</tool_call>",
                "<tool_call><tool_call>" + body + "</tool_call>",
                "<tool_call></tool_call>",
                "<tool_call>   </tool_call>",
                "<tool_call>" + "\x00" * 1000 + "</tool_call>",
                "```json\n" + body + "\n```",
            ]
        )
    if kind == 9:  # 50 MB outputs
        return _wrap(json.dumps({"name": "blob", "arguments": {"megabytes": 50}}))
    if kind == 10:  # tool overruns its timeout
        return _wrap(json.dumps({"name": "nap", "arguments": {"seconds": 5}}))
    # raw noise
    n = rng.randint(0, 400)
    return "".join(rng.choice([*WEIRD, "a", " ", "<", ">"]) for _ in range(n))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def _kinds(rng: random.Random) -> list[int]:
    """Mostly cheap mutations; a few 50 MB outputs and timeouts."""
    out = []
    for i in range(N_STRINGS):
        if i % 800 == 17:
            out.append(9)
        elif i % 1000 == 33:
            out.append(10)
        else:
            out.append(rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 0, 1, 3, 7]))
    return out


def _check(text: str, calls: int, errors: int, messages: tuple[Any, ...]) -> None:
    assert len(messages) == calls + errors, (text[:200], calls, errors, len(messages))
    for m in messages:
        assert m.role == "tool" and isinstance(m.content, str)
        assert len(m.content) <= MAX_OUT + 64, len(m.content)
        m.content.encode("utf-8")  # no lone surrogates reach the tokenizer


async def _fuzz(parser: Any, executor: ToolExecutor, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    kinds = _kinds(rng)
    crashes: list[str] = []
    counts = {"strings": 0, "calls": 0, "parse_errors": 0, "tool_errors": 0, "timeouts": 0}
    rss: list[float] = []
    for i, kind in enumerate(kinds):
        text = _mutate(rng, kind)
        try:
            parsed = parser.parse(text)
            res = await executor.run(parsed.tool_calls, parsed.errors)
            _check(text, len(parsed.tool_calls), len(parsed.errors), res.messages)
        except AssertionError as e:
            crashes.append(f"kind {kind}: broken result {e!s:.300}")
            continue
        except BaseException as e:  # a crash: the episode would die
            crashes.append(f"kind {kind}: {type(e).__name__}: {e!s:.300} on {text[:120]!r}")
            continue
        counts["strings"] += 1
        counts["calls"] += len(parsed.tool_calls)
        counts["parse_errors"] += len(parsed.errors)
        counts["tool_errors"] += int(res.metrics["tool_errors"])
        counts["timeouts"] += int(res.metrics["tool_timeouts"])
        del parsed, res, text
        if i == 600 or i == len(kinds) - 1:
            gc.collect()
            rss.append(_rss_mb())
    return {"crashes": crashes, "counts": counts, "rss": rss, "n": len(kinds)}


def test_tool_call_fuzz_no_crash_bounded_memory():
    rec = ChaosRecord("tool-call-fuzz", "parser+executor")
    t0 = time.monotonic()
    executor = ToolExecutor(
        TOOLS, max_parallel=8, max_calls_per_turn=100, timeout_s=0.2, max_output_chars=MAX_OUT
    )
    try:
        out = asyncio.run(_fuzz(get_parser("hermes"), executor, seed=14))
        growth = out["rss"][-1] - out["rss"][0]
        rec.outcome = f"{len(out['crashes'])} crashes in {out['n']} strings"
        rec.episodes_lost = len(out["crashes"])
        rec.duplicated = 0
        rec.steps_lost = 0
        rec.recovery_s = 0.0
        rec.detail = (
            f"{out['counts']}; RSS {out['rss'][0]:.0f} → {out['rss'][-1]:.0f} MB "
            f"(+{growth:.0f} MB after warm-up); {time.monotonic() - t0:.0f}s"
        )
        assert out["n"] >= 5000
        assert not out["crashes"], out["crashes"][:10]
        c = out["counts"]
        # The fuzz reached every path: calls run, malformed calls reported, tools failed.
        assert c["calls"] > 1000 and c["parse_errors"] > 1000 and c["tool_errors"] > 1000, c
        assert c["timeouts"] >= 5, c
        assert growth < 150, f"RSS grew {growth:.0f} MB over {out['n']} strings"
    finally:
        rec.write()
