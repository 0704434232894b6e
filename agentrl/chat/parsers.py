"""Tool-call parsers: model text → (content, tool calls, errors), one per model family.

Example:
    >>> out = get_parser("hermes").parse(
    ...     'Let me add.\\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    ... )
    >>> out.content, out.tool_calls[0].name, out.tool_calls[0].arguments, out.tool_calls[0].id
    ('Let me add.', 'add', {'a': 1}, 'call_0')
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentrl.chat.parsed import ParsedOutput, ToolCallParser, snippet, unknown_name_error
from agentrl.types import ToolCall

__all__ = [
    "HermesToolCallParser",
    "ParsedOutput",
    "ToolCallParser",
    "get_parser",
    "make_tool_parser",
    "parser_names",
    "register_parser",
    "render_tool_call",
    "unknown_name_error",
]


class HermesToolCallParser:
    """Hermes / Qwen2.5 format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    ``arguments`` may be an object or a JSON string holding one; it may be left
    out for a call without arguments. Whitespace around the JSON is ignored.

    Args:
        start_tag: Opening tag.
        end_tag: Closing tag.
    """

    def __init__(self, start_tag: str = "<tool_call>", end_tag: str = "</tool_call>") -> None:
        self.start_tag = start_tag
        self.end_tag = end_tag
        self._usage = f'use {start_tag}{{"name": ..., "arguments": {{...}}}}{end_tag}'

    def parse(self, text: str) -> ParsedOutput:
        content: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        n = 0  # 1-based index of the call block, well-formed or not, for error messages
        while (start := text.find(self.start_tag, pos)) != -1:
            content.append(text[pos:start])
            n += 1
            body_start = start + len(self.start_tag)
            end = text.find(self.end_tag, body_start)
            next_start = text.find(self.start_tag, body_start)
            if end == -1 or (next_start != -1 and next_start < end):
                stop = len(text) if next_start == -1 else next_start
                body = text[body_start:stop]
                errors.append(
                    f"tool call {n}: no closing {self.end_tag} after "
                    f"{self.start_tag}{snippet(body)}; {self._usage}"
                )
                pos = stop
                continue
            body = text[body_start:end]
            pos = end + len(self.end_tag)
            call_or_error = self._parse_body(body, len(calls))
            if isinstance(call_or_error, ToolCall):
                calls.append(call_or_error)
            else:
                errors.append(f"tool call {n}: {call_or_error}; {self._usage}")
        content.append(text[pos:])
        return ParsedOutput("".join(content).strip(), tuple(calls), tuple(errors))

    def _parse_body(self, body: str, index: int) -> ToolCall | str:
        """A ToolCall, or the reason ``body`` is not one."""
        try:
            obj: Any = json.loads(body)
        except json.JSONDecodeError as e:
            return f"invalid JSON ({e.msg} at char {e.pos}): {snippet(body)}"
        except (ValueError, RecursionError) as e:  # ints past the digit limit, deep nesting
            return f"unreadable JSON ({type(e).__name__}: {snippet(str(e))}): {snippet(body)}"
        if not isinstance(obj, dict):
            return f"expected a JSON object, got {type(obj).__name__}"
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return 'missing "name" (a non-empty string)'
        args: Any = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                return f'"arguments" string is not valid JSON ({e.msg} at char {e.pos})'
            except (ValueError, RecursionError) as e:
                return f'"arguments" string is unreadable JSON ({type(e).__name__})'
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return f'"arguments" must be a JSON object, got {type(args).__name__}'
        return ToolCall(name=name.strip(), arguments=args, id=f"call_{index}")


def render_tool_call(call: ToolCall) -> str:
    """The Hermes markup of ``call``, as agentrl's chat template writes it.

    Example:
        >>> render_tool_call(ToolCall("add", {"a": 1}))
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    """
    args = json.dumps(call.arguments, ensure_ascii=False)
    return f'<tool_call>{{"name": {json.dumps(call.name)}, "arguments": {args}}}</tool_call>'


def _harmony() -> ToolCallParser:
    from agentrl.chat.harmony import HarmonyParser  # needs openai_harmony, so made on demand

    return HarmonyParser()


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesToolCallParser,
    "qwen": HermesToolCallParser,
    # gpt-oss; vLLM's own "openai" is a stub outside its server ("vllm:openai" still gets it).
    "harmony": _harmony,
    "openai": _harmony,
}


def register_parser(name: str, factory: Callable[[], ToolCallParser]) -> None:
    """Makes ``get_parser(name)`` return ``factory()`` (for another model family).

    Raises:
        ValueError: ``name`` is taken.
    """
    if name in _PARSERS:
        raise ValueError(f"a tool-call parser named {name!r} is already registered")
    _PARSERS[name] = factory


def parser_names() -> tuple[str, ...]:
    """The registered parser names."""
    return tuple(sorted(_PARSERS))


def get_parser(name: str) -> ToolCallParser:
    """A new parser for the model family ``name`` (e.g. "hermes").

    Raises:
        ValueError: Unknown name; the message lists the valid ones.
    """
    try:
        factory = _PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {name!r}; valid: {', '.join(parser_names())}"
        ) from None
    return factory()


def make_tool_parser(name: str, tokenizer: Any = None) -> ToolCallParser:
    """The tool-call parser ``name`` for a model with ``tokenizer``.

    Names are looked up in agentrl's registry first (``hermes``, the
    dependency-free fallback; ``harmony`` alias ``openai`` for gpt-oss; and
    anything ``register_parser`` added), then in
    vLLM's (~50 families: ``llama3_json``, ``pythonic``, ``mistral``,
    ``deepseek_v3``, ``qwen3_xml``, …; ``vllm:NAME`` forces vLLM's even where
    agentrl has one of that name). ``auto`` detects the family from the
    tokenizer (see :func:`agentrl.chat.detect.detect_tool_parser`).

    Args:
        name: Parser name, ``vllm:NAME`` or ``auto``.
        tokenizer: The policy's Hugging Face tokenizer; needed for ``auto`` and vLLM parsers.

    Raises:
        ValueError: Unknown name (the message names the nearest and lists all),
            vLLM missing for a vLLM name, or the parser does not fit the tokenizer.
    """
    if name == "auto":
        if tokenizer is None:
            raise ValueError("tool parser 'auto' needs the model's tokenizer to detect its family")
        from agentrl.chat.detect import detect_tool_parser

        name = detect_tool_parser(tokenizer)
    if name in _PARSERS:
        return _PARSERS[name]()
    from agentrl.chat.vllm_parsers import VLLMToolCallParser, vllm_tool_parser_names

    vllm_names = vllm_tool_parser_names()
    vllm_name = name.removeprefix("vllm:")
    if vllm_name in vllm_names:
        if tokenizer is None:
            raise ValueError(f"vLLM's tool parser {vllm_name!r} needs the model's tokenizer")
        return VLLMToolCallParser(vllm_name, tokenizer)
    vllm_key = "vLLM" if vllm_names else "vLLM (not installed, so none)"
    raise unknown_name_error(
        "tool-call parser", name, {"agentrl": [*parser_names(), "auto"], vllm_key: vllm_names}
    )
