"""``auto`` parsers: the tool-call and reasoning formats of a model, read off its tokenizer.

The evidence is the chat template (the markup it writes for tool calls and
thinking) or, for a tokenizer without a template, its vocabulary. A format is
chosen only when exactly one family matches; otherwise the error names the
candidates so the user can pick one in the config.

Example:
    >>> detect_parsers(qwen3_tokenizer)  # doctest: +SKIP
    DetectedParsers(tool_parser='hermes', reasoning_parser='qwen3')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DetectedParsers", "detect_parsers", "detect_reasoning_parser", "detect_tool_parser"]

_DEEPSEEK_CALLS = "<｜tool▁calls▁begin｜>"
_LLAMA3_HEADER = "<|start_header_id|>"


class _Evidence:
    """``has(marker)``: the marker is in the chat template (or, without one, the vocabulary)."""

    def __init__(self, tokenizer: Any) -> None:
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # named templates (e.g. "default", "tool_use")
            template = "\n".join(str(t) for t in template.values())
        self.template = template if isinstance(template, str) else ""
        self._vocab: dict[str, int] | None = None
        self._tokenizer = tokenizer

    def __call__(self, marker: str) -> bool:
        if self.template:
            return marker in self.template
        if self._vocab is None:
            try:
                self._vocab = dict(self._tokenizer.get_vocab())
            except Exception:
                self._vocab = {}
        return marker in self._vocab

    def source(self) -> str:
        return "chat template" if self.template else "vocabulary (no chat template)"


_Has = _Evidence


def _deepseek(has: _Has) -> bool:
    return has("<｜Assistant｜>") or has(_DEEPSEEK_CALLS)


def _thinks(has: _Has) -> bool:
    return has("<think>") or has("</think>")  # some templates only strip a closing tag


_TOOL_RULES: tuple[tuple[str, Callable[[_Has], bool]], ...] = (
    ("mistral", lambda has: has("[TOOL_CALLS]")),
    ("deepseek_v3", lambda has: has(_DEEPSEEK_CALLS) and (has("```json") or not has.template)),
    ("deepseek_v31", lambda has: has(_DEEPSEEK_CALLS) and not has("```json")),
    ("kimi_k2", lambda has: has("<|tool_calls_section_begin|>")),
    ("harmony", lambda has: has("<|channel|>") and has("<|call|>")),
    ("granite", lambda has: has("<|tool_call|>")),
    ("qwen3_xml", lambda has: has("<tool_call>") and has("<function=")),
    ("glm45", lambda has: has("<tool_call>") and has("<arg_key>")),
    (
        "hermes",
        lambda has: has("<tool_call>") and not has("<function=") and not has("<arg_key>"),
    ),
    ("llama4_pythonic", lambda has: has("<|python_start|>")),
    ("pythonic", lambda has: has("func_name1(") and not has("<|python_start|>")),
    (
        "llama3_json",
        lambda has: (
            has(_LLAMA3_HEADER)
            and (has("<|python_tag|>") or has('"parameters"'))
            and not has("func_name1(")
        ),
    ),
)
"""(family, predicate over the evidence), checked all at once; exactly one must hold."""

_REASONING_RULES: tuple[tuple[str, Callable[[_Has], bool]], ...] = (
    ("mistral", lambda has: has("[THINK]")),
    ("harmony", lambda has: has("<|channel|>")),
    # DeepSeek-R1 always thinks; V3.1 (its tool calls have no ```json fence) is hybrid
    # and thinks only when asked, which vLLM's deepseek_v3 reasoning parser follows.
    (
        "deepseek_r1",
        lambda has: _deepseek(has) and _thinks(has) and (has("```json") or not has.template),
    ),
    (
        "deepseek_v3",
        lambda has: _deepseek(has) and _thinks(has) and bool(has.template) and not has("```json"),
    ),
    ("qwen3", lambda has: _thinks(has) and has("<|im_start|>")),
)

_THINK_FAMILIES = ("deepseek_r1", "qwen3")


@dataclass(frozen=True)
class DetectedParsers:
    """What :func:`detect_parsers` found.

    Attributes:
        tool_parser: The tool-call parser's name.
        reasoning_parser: The reasoning parser's name, or None for a model that
            does not think in marked blocks.
    """

    tool_parser: str
    reasoning_parser: str | None


def _matches(rules: tuple[tuple[str, Callable[[_Has], bool]], ...], has: _Evidence) -> list[str]:
    return [name for name, rule in rules if rule(has)]


def detect_tool_parser(tokenizer: Any) -> str:
    """The tool-call parser for ``tokenizer``'s model family.

    Raises:
        ValueError: No family or several families match; the message names the choices.
    """
    has = _Evidence(tokenizer)
    found = _matches(_TOOL_RULES, has)
    if len(found) == 1:
        return found[0]
    every = ", ".join(name for name, _ in _TOOL_RULES)
    if not found:
        raise ValueError(
            f"tool_parser 'auto': no known tool-call markup in the tokenizer's {has.source()}; "
            f"set rollout.tool_parser to the model's family, e.g. one of: {every} "
            "(or any vLLM tool parser name)"
        )
    raise ValueError(
        f"tool_parser 'auto': the tokenizer's {has.source()} fits several tool-call formats: "
        f"{', '.join(found)}; set rollout.tool_parser to one of them"
    )


def detect_reasoning_parser(tokenizer: Any) -> str | None:
    """The reasoning parser for ``tokenizer``'s model, or None if it has no thinking markup.

    Raises:
        ValueError: The markup fits several families (e.g. a bare ``<think>``); the
            message names the choices.
    """
    has = _Evidence(tokenizer)
    found = _matches(_REASONING_RULES, has)
    if not found and _thinks(has):
        found = list(_THINK_FAMILIES)
    if len(found) <= 1:
        return found[0] if found else None
    raise ValueError(
        f"reasoning_parser 'auto': the tokenizer's {has.source()} fits several reasoning "
        f"formats: {', '.join(found)}; set rollout.reasoning_parser to one of them"
    )


def detect_parsers(tokenizer: Any) -> DetectedParsers:
    """Both parsers for ``tokenizer``'s model (see the two functions above).

    Raises:
        ValueError: Either detection is ambiguous (or finds no tool-call format).
    """
    return DetectedParsers(detect_tool_parser(tokenizer), detect_reasoning_parser(tokenizer))
