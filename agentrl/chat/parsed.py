"""What every tool-call parser shares: its output, its Protocol, and its error wording."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agentrl.types import ToolCall

__all__ = ["ParsedOutput", "ToolCallParser", "snippet", "unknown_name_error"]


@dataclass(frozen=True)
class ParsedOutput:
    """What a parser found in one assistant turn.

    Attributes:
        content: The text with tool-call markup removed (stripped).
        tool_calls: Well-formed calls in order, with ids ``call_0``, ``call_1``, …
        errors: One message per malformed call, in order, meant for the model to read.
        reasoning: The turn's reasoning (thinking) text, when a reasoning parser
            split it off before the tool calls were parsed; else "".
    """

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()
    reasoning: str = ""


@runtime_checkable
class ToolCallParser(Protocol):
    """Finds tool calls in a model's decoded text."""

    def parse(self, text: str) -> ParsedOutput:
        """Parses one assistant turn; never raises on malformed calls (they go to ``errors``)."""
        ...


def snippet(text: str, limit: int = 80) -> str:
    """``text`` on one line, cut to ``limit`` characters (for error messages)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def unknown_name_error(kind: str, name: str, groups: Mapping[str, Sequence[str]]) -> ValueError:
    """A ValueError for an unknown parser ``name``: the nearest names, then every choice.

    Args:
        kind: What was asked for, e.g. "tool-call parser".
        name: The name given.
        groups: Valid names by where they come from (e.g. {"agentrl": [...], "vLLM": [...]}).
    """
    every = list(dict.fromkeys(n for names in groups.values() for n in names))
    near = difflib.get_close_matches(name, every, n=3, cutoff=0.5)
    hint = f"; nearest: {', '.join(near)}" if near else ""
    listing = "; ".join(f"{src}: {', '.join(names)}" for src, names in groups.items())
    return ValueError(f"unknown {kind} {name!r}{hint}. Available — {listing}")
