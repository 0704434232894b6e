"""How messages are written for a chat template: call style, call ids, injected tools.

Small text helpers of :mod:`agentrl.chat.tokenization`: the :class:`CallStyle` a
template wants (found by probing it), Mistral-style 9-character ids, the Hermes tools
block injected for templates that drop tools, and where an assistant turn starts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.types import ToolCall

__all__ = [
    "CallStyle",
    "common_prefix",
    "fallback_tools_text",
    "hermes_call",
    "nine_char_id",
    "turn_start",
]

_NINE = re.compile(r"^[A-Za-z0-9]{9}$")
_B62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def turn_start(chat_specials: Sequence[str], gen: str, text: str) -> int:
    """Where the assistant turn starts in ``text`` (a conversation ending with that turn),
    given the generation prompt ``gen``: at the end of ``gen`` when it is a prefix, else at
    the end of the last special token the two share (R1's prompt opens a ``<think>`` block,
    which the history does not keep)."""
    start = common_prefix(gen, text)
    if start == len(gen):
        return start
    head = text[:start]
    ends = [head.rfind(s) + len(s) for s in chat_specials if s in head]
    return max(ends, default=start)


@dataclass(frozen=True)
class CallStyle:
    """How a template wants tool calls, found by probing it.

    Attributes:
        arguments_as_string: Arguments are passed as a JSON string, not an object.
        nine_char_ids: Call ids must be 9 alphanumeric characters.
        single_call: The template renders at most one call per assistant turn.
        renders_calls: The template renders assistant tool calls at all without raising.
        error: The template's message when no style rendered a call.
    """

    arguments_as_string: bool = False
    nine_char_ids: bool = False
    single_call: bool = False
    renders_calls: bool = True
    error: str = ""


def nine_char_id(call_id: str) -> str:
    """``call_id`` if it is 9 alphanumerics, else a deterministic such id derived from it."""
    if _NINE.match(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha1(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, 62)
        out.append(_B62[r])
    return "".join(out)


_FALLBACK_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def fallback_tools_text(tools: Sequence[dict[str, Any]]) -> str:
    """The Hermes-format tools block injected into the system message (``inject_tools``)."""
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return _FALLBACK_TOOLS.format(tools=lines)


def hermes_call(call: ToolCall) -> str:
    args = json.dumps(call.arguments, ensure_ascii=False)
    return f'<tool_call>\n{{"name": {json.dumps(call.name)}, "arguments": {args}}}\n</tool_call>'
