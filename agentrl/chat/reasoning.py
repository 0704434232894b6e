"""One assistant turn → reasoning, content and tool calls.

A reasoning parser splits off the model's thinking (``<think>…</think>`` and
the like); the tool-call parser then reads the rest, the order vLLM's own
server uses. Reasoning parsers come from vLLM's registry
(:class:`~agentrl.chat.vllm_parsers.VLLMReasoningParser`); without one, the
whole turn is content.

Example:
    >>> parser = make_turn_parser("hermes", None, tokenizer=None)
    >>> out = parser.parse('Sure.<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    >>> out.content, out.tool_calls[0].name
    ('Sure.', 'f')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from agentrl.chat.parsers import ParsedOutput, ToolCallParser, make_tool_parser, unknown_name_error

__all__ = [
    "ReasoningParser",
    "TurnParser",
    "make_reasoning_parser",
    "make_turn_parser",
]


@runtime_checkable
class ReasoningParser(Protocol):
    """Splits a model's decoded turn into its reasoning and its content."""

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, content); never raises (a turn it cannot read is all content)."""
        ...


_HARMONY = ("harmony", "openai_gptoss")
"""gpt-oss names served by agentrl's harmony parser (vLLM's ``openai_gptoss`` is a stub
outside its server; ``vllm:openai_gptoss`` still gets vLLM's)."""


def make_reasoning_parser(name: str | None, tokenizer: Any = None) -> ReasoningParser | None:
    """The reasoning parser ``name`` for a model with ``tokenizer``, or None.

    Args:
        name: None or "none" (no reasoning split), "auto" (detected from the
            tokenizer; None for a model without thinking markup), "harmony"
            (gpt-oss's analysis channel; alias "openai_gptoss"), or any name in
            vLLM's reasoning registry (``deepseek_r1``, ``qwen3``, …; ``vllm:NAME`` too).
        tokenizer: The policy's Hugging Face tokenizer.

    Raises:
        ValueError: Unknown name (nearest and all listed), vLLM missing, an
            ambiguous ``auto``, or a parser that does not fit the tokenizer.
    """
    if name is None or name == "none":
        return None
    if name == "auto":
        if tokenizer is None:
            raise ValueError("reasoning parser 'auto' needs the model's tokenizer")
        from agentrl.chat.detect import detect_reasoning_parser

        detected = detect_reasoning_parser(tokenizer)
        if detected is None:
            return None
        name = detected
    if name in _HARMONY:
        from agentrl.chat.harmony import HarmonyParser

        return HarmonyParser()
    if tokenizer is None:
        raise ValueError(f"reasoning parser {name!r} needs the model's tokenizer")
    from agentrl.chat.vllm_parsers import VLLMReasoningParser, vllm_reasoning_parser_names

    names = vllm_reasoning_parser_names()
    vllm_name = name.removeprefix("vllm:")
    if vllm_name in names:
        return VLLMReasoningParser(vllm_name, tokenizer)
    vllm_key = "vLLM" if names else "vLLM (not installed, so none)"
    groups = {"agentrl": ["none", "auto", *_HARMONY], vllm_key: list(names)}
    raise unknown_name_error("reasoning parser", name, groups)


@dataclass(frozen=True)
class TurnParser:
    """Reasoning first, then tool calls in what is left.

    Attributes:
        tools: The tool-call parser.
        reasoning: The reasoning parser, or None (the whole turn is content).
    """

    tools: ToolCallParser
    reasoning: ReasoningParser | None = None

    def parse(self, text: str) -> ParsedOutput:
        """The turn's content, tool calls, parse errors and reasoning; never raises."""
        thought, rest = self.reasoning.split(text) if self.reasoning else ("", text)
        out = self.tools.parse(rest)
        return replace(out, reasoning=thought.strip()) if thought.strip() else out

    def with_tools(self, schemas: Sequence[Mapping[str, Any]]) -> TurnParser:
        """This parser for an episode with these OpenAI tool schemas.

        Parsers whose families write untyped argument text (e.g. qwen3_xml) use
        the schemas to give values their JSON types; others ignore them.
        """
        bind = getattr(self.tools, "with_tools", None)
        return replace(self, tools=bind(schemas)) if callable(bind) else self


def make_turn_parser(
    tool_parser: str = "hermes", reasoning_parser: str | None = None, tokenizer: Any = None
) -> TurnParser:
    """The turn parser of a model: see :func:`~agentrl.chat.parsers.make_tool_parser`
    and :func:`make_reasoning_parser` for the names.

    Raises:
        ValueError: Either name is unknown or does not fit the tokenizer.
    """
    return TurnParser(
        make_tool_parser(tool_parser, tokenizer), make_reasoning_parser(reasoning_parser, tokenizer)
    )
