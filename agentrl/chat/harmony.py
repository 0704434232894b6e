"""gpt-oss (harmony) turns → reasoning, content and tool calls, read by OpenAI's own parser.

A harmony turn is a run of messages, e.g.
``<|channel|>analysis<|message|>…<|end|><|start|>assistant to=functions.add<|channel|>commentary
<|constrain|>json<|message|>{"a": 2}<|call|>``: reasoning on channel ``analysis``, the
answer on ``final``, one tool call per message addressed ``to=functions.NAME``.
vLLM's ``openai`` parsers only work inside its streaming server, so this one
re-encodes the decoded turn with ``openai_harmony`` (vLLM's own gpt-oss
dependency, imported when a parser is made) and reads its messages.

Example:
    >>> p = HarmonyParser()  # doctest: +SKIP
    >>> out = p.parse('<|channel|>commentary to=functions.add <|message|>{"a": 2}<|call|>')
    >>> out.tool_calls[0].name, out.tool_calls[0].arguments  # doctest: +SKIP
    ('add', {'a': 2})
"""

from __future__ import annotations

import functools
import json
from typing import Any

from agentrl.chat.parsed import ParsedOutput, snippet
from agentrl.types import ToolCall

__all__ = ["HarmonyParser"]

_START = "<|start|>"
_MARKUP = ("<|channel|>", "<|message|>", "<|start|>", "<|call|>", "<|return|>", "<|end|>")
_USAGE = (
    "write <|channel|>final<|message|>ANSWER, or a call as "
    '<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"arg": ...}<|call|>'
)


@functools.cache
def _encoding() -> Any:
    """The gpt-oss harmony encoding (loaded once per process)."""
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    except ImportError as e:
        raise ValueError(
            f"the harmony parser needs the openai_harmony package (pip install openai-harmony): {e}"
        ) from e
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as e:  # the tokenizer file may be missing offline
        raise ValueError(f"could not load the gpt-oss harmony encoding ({e})") from e


class HarmonyParser:
    """Tool-call and reasoning parser for gpt-oss's harmony format.

    Usable as ``rollout.tool_parser`` (``parse``) and ``rollout.reasoning_parser``
    (``split``). The turn may start after the generation prompt's
    ``<|start|>assistant`` (as the AgentLoop decodes it) or with it; it may end
    on ``<|call|>``, ``<|return|>``, ``<|end|>`` or nothing.

    Raises:
        ValueError: openai_harmony is missing or its encoding cannot load.
    """

    name = "harmony"

    def __init__(self) -> None:
        self._enc = _encoding()

    def _messages(self, text: str) -> list[Any]:
        """The turn's harmony messages; raises on text that is not harmony."""
        body = text.lstrip()
        if not body.startswith(_START):
            body = _START + "assistant" + body
        tokens = self._enc.encode(body, allowed_special="all")
        return list(self._enc.parse_messages_from_completion_tokens(tokens, None, strict=True))

    def _read(self, text: str) -> list[Any] | str:
        """The messages, or the reason the turn cannot be read."""
        try:
            return self._messages(text)
        except Exception as e:  # HarmonyError and friends: the model wrote malformed markup
            return f"could not read the turn as harmony ({snippet(str(e))}): {snippet(text)}"

    def parse(self, text: str) -> ParsedOutput:
        """Content (``final``, plain ``commentary``), calls, errors, reasoning; never raises."""
        if not any(m in text for m in _MARKUP):
            return ParsedOutput(text.strip())  # plain text: all content
        messages = self._read(text)
        if isinstance(messages, str):
            return ParsedOutput(text.strip(), errors=(f"{messages}; {_USAGE}",))
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        n = 0  # 1-based index of the call message, well-formed or not
        for msg in messages:
            body = _text(msg)
            recipient = msg.recipient
            if recipient:
                n += 1
                call = _call(recipient, body, len(calls))
                if isinstance(call, ToolCall):
                    calls.append(call)
                else:
                    errors.append(f"tool call {n} (to={recipient}): {call}; {_USAGE}")
            elif msg.channel == "analysis":
                reasoning.append(body)
            else:  # final, or a commentary preamble the user sees
                content.append(body)
        return ParsedOutput(
            "\n".join(c.strip() for c in content if c.strip()),
            tuple(calls),
            tuple(errors),
            "\n".join(r.strip() for r in reasoning if r.strip()),
        )

    def split(self, text: str) -> tuple[str, str]:
        """(analysis text, the other messages re-rendered as harmony); never raises."""
        messages = self._read(text) if any(m in text for m in _MARKUP) else text
        if isinstance(messages, str):
            return "", text
        thought = [_thought(m) for m in messages]
        if not any(thought):
            return "", text
        rest = (
            self._enc.decode(self._enc.render(m))
            for m, t in zip(messages, thought, strict=True)
            if not t
        )
        reasoning = (_text(m).strip() for m, t in zip(messages, thought, strict=True) if t)
        return "\n".join(r for r in reasoning if r), "".join(rest)


def _thought(message: Any) -> bool:
    return message.channel == "analysis" and not message.recipient


def _text(message: Any) -> str:
    return "".join(getattr(c, "text", "") for c in message.content)


def _call(recipient: str, body: str, index: int) -> ToolCall | str:
    """The call ``recipient`` ← ``body``, or the reason it is not one."""
    if not recipient.startswith("functions.") or not recipient.removeprefix("functions.").strip():
        return "the recipient is not a function (to=functions.NAME)"
    name = recipient.removeprefix("functions.").strip()
    try:
        args: Any = json.loads(body) if body.strip() else {}
    except json.JSONDecodeError as e:
        return f"invalid JSON arguments ({e.msg} at char {e.pos}): {snippet(body)}"
    except (ValueError, RecursionError) as e:
        return f"unreadable JSON arguments ({type(e).__name__}): {snippet(body)}"
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    return ToolCall(name=name, arguments=args, id=f"call_{index}")
