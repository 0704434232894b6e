"""Adapters from vLLM's parser registries to agentrl's tool-call and reasoning parsers.

vLLM ships a tool-call parser for most chat-model families (``vllm.tool_parsers``:
hermes, llama3_json, pythonic, mistral, deepseek_v3, qwen3_xml, kimi_k2, …) and a
reasoning parser for most thinking models (``vllm.reasoning``: deepseek_r1, qwen3,
…). agentrl does not rewrite them: :class:`VLLMToolCallParser` turns any
registered tool parser into a :class:`~agentrl.chat.parsers.ToolCallParser`, and
:class:`VLLMReasoningParser` turns any registered reasoning parser into the split
of a turn into reasoning and content.

vLLM is imported lazily, inside these classes, so the rest of agentrl imports
without it. vLLM's parsers swallow what they cannot read and hand the text back
as content; the adapter turns that into a parse error the model gets to read
(and the executor counts), and turns any exception a parser raises into one too.

Example:
    >>> parser = VLLMToolCallParser("llama3_json", tokenizer)  # doctest: +SKIP
    >>> parser.parse('{"name": "add", "parameters": {"a": 1}}').tool_calls  # doctest: +SKIP
    (ToolCall(name='add', arguments={'a': 1}, id='call_0'),)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentrl.chat.parsed import ParsedOutput, snippet
from agentrl.types import ToolCall

__all__ = [
    "VLLMReasoningParser",
    "VLLMToolCallParser",
    "vllm_reasoning_parser_names",
    "vllm_tool_parser_names",
]

_RANDOM_ID_PREFIX = "chatcmpl-tool-"
"""vLLM's default tool-call id (random); replaced by ``call_<i>`` so ids are deterministic."""

_MARKER_ATTRS = (
    "tool_calls_start_token",
    "tool_call_start_token",
    "bot_token",
    "bot_string",
    "tc_start",
)
"""Attributes where vLLM's hand-written parsers keep the text that opens a tool call."""

_TOOL_STATES = ("TOOL_PREAMBLE", "TOOL_NAME", "TOOL_ARGS", "TOOL_BETWEEN")


def vllm_tool_parser_names() -> tuple[str, ...]:
    """The tool-call parsers vLLM registers (empty when vLLM is not installed)."""
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        return ()
    return tuple(ToolParserManager.list_registered())


def vllm_reasoning_parser_names() -> tuple[str, ...]:
    """The reasoning parsers vLLM registers (empty when vLLM is not installed)."""
    try:
        from vllm.reasoning import ReasoningParserManager
    except ImportError:
        return ()
    return tuple(ReasoningParserManager.list_registered())


def _request(tools: Sequence[Mapping[str, Any]] | None) -> Any:
    """The chat request vLLM's parsers read the tool schemas (and tool_choice) from."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[], model="agentrl", tools=_tool_params(tools))


def _tool_params(tools: Sequence[Mapping[str, Any]] | None) -> Any:
    """vLLM's typed tool params for OpenAI-format schemas (None for no tools)."""
    if not tools:
        return None
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    return [ChatCompletionToolsParam.model_validate(t) for t in tools]


def _quiet(parser: Any) -> None:
    """Silences the tracebacks vLLM's parser logs for text it cannot read.

    The adapter reports those turns itself (a parse error the model reads and the
    executor counts); a weak policy writes many, and a traceback each would bury
    the run's log. Only the parser's own modules are quieted, in this process.
    """
    for obj in (parser, getattr(parser, "_parser_engine", None)):
        if obj is not None:
            logging.getLogger(type(obj).__module__).setLevel(logging.CRITICAL)


def _markers(parser: Any) -> tuple[str, ...]:
    """Texts that open a tool call in ``parser``'s format (to spot calls it could not read).

    Hand-written parsers keep them in attributes; engine-based ones declare them as the
    terminals that move the grammar from content into a tool call.
    """
    found = [v for a in _MARKER_ATTRS if isinstance(v := getattr(parser, a, None), str) and v]
    config: Any = getattr(getattr(parser, "_parser_engine", None), "parser_engine_config", None)
    for (state, terminal), transition in getattr(config, "transitions", {}).items():
        if state.name == "CONTENT" and transition.next_state.name in _TOOL_STATES:
            literal = config.terminals.get(terminal)
            found.extend([literal] if isinstance(literal, str) else literal or ())
    return tuple(dict.fromkeys(m for m in found if m.strip()))


def _build(
    kind: str,
    name: str,
    get: Callable[[str], Any],
    registered: Callable[[], Iterable[str]],
    *args: Any,
) -> Any:
    """The parser vLLM registers as ``name`` in its ``kind`` registry, built from ``args``.

    Args:
        kind: "tool-call" or "reasoning" (for the error messages).
        name: The registered name.
        get: The registry's lookup (raises KeyError for an unknown name).
        registered: The registry's list of names.
        *args: The parser's constructor arguments (the tokenizer first).

    Raises:
        ValueError: ``name`` is not registered, or the parser rejects ``args``.
    """
    try:
        cls = get(name)
    except KeyError:
        raise ValueError(
            f"vLLM has no {kind} parser {name!r}; registered: " + ", ".join(registered())
        ) from None
    try:
        return cls(*args)
    except Exception as e:
        raise ValueError(
            f"vLLM's {name!r} {kind} parser does not accept this tokenizer "
            f"({type(e).__name__}: {e}); is it the right family for the model?"
        ) from e


_GPT_OSS_HINT = " (gpt-oss: 'harmony', agentrl's parser built on openai_harmony)"


def _require_finished_turns(what: str, hint: str, probe: Callable[[], object]) -> None:
    """Raises ``ValueError("what (reason); hint")`` when the parser is a stub for finished turns.

    ``probe`` parses empty text; a ``NotImplementedError`` from it marks the stub.
    Any other error is ignored: empty text is not a turn, and real turns report
    their own errors.
    """
    try:
        probe()
    except NotImplementedError as e:
        raise ValueError(f"{what} ({e}); {hint}") from e
    except Exception:
        pass


class VLLMToolCallParser:
    """Any tool-call parser registered in vLLM, as an agentrl ``ToolCallParser``.

    Tool-call ids the family's parser makes itself (Mistral's 9-character ids,
    Kimi's ``functions.NAME:i``) are kept, so they round-trip through the chat
    template; vLLM's random default ids become ``call_0``, ``call_1``, …

    Args:
        name: A name in vLLM's ``ToolParserManager`` (e.g. "llama3_json").
        tokenizer: The policy's Hugging Face tokenizer (parsers look up their
            special tokens in its vocabulary).
        tools: OpenAI-format tool schemas; families whose arguments are untyped
            text (qwen3_xml) use them to give values their JSON types.

    Raises:
        ValueError: vLLM is not installed, ``name`` is not registered, the parser
            does not accept this tokenizer, or it cannot parse a finished turn.
    """

    def __init__(
        self, name: str, tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        try:
            from vllm.tool_parsers import ToolParserManager
        except ImportError as e:
            raise ValueError(f"tool-call parser {name!r} needs vLLM ({e})") from e
        self.name = name
        self.tokenizer = tokenizer
        self.tools = tuple(tools or ())
        self._parser = _build(
            "tool-call",
            name,
            ToolParserManager.get_tool_parser,
            ToolParserManager.list_registered,
            tokenizer,
            _tool_params(self.tools),
        )
        self._request = _request(self.tools)
        self._markers = _markers(self._parser)
        _quiet(self._parser)
        self._bound: dict[str, VLLMToolCallParser] = {}
        _require_finished_turns(
            f"vLLM's {name!r} tool-call parser cannot parse a finished turn",
            "pick another parser" + _GPT_OSS_HINT * (name == "openai"),
            lambda: self._parser.extract_tool_calls("", self._request),
        )

    def with_tools(self, tools: Sequence[Mapping[str, Any]]) -> VLLMToolCallParser:
        """This parser for an episode whose tools have the OpenAI schemas ``tools``."""
        if tuple(tools) == self.tools:
            return self
        key = json.dumps(list(tools), sort_keys=True, default=str)
        if key not in self._bound:
            if len(self._bound) >= 64:  # envs with per-task tool sets: keep the cache bounded
                self._bound.pop(next(iter(self._bound)))
            self._bound[key] = VLLMToolCallParser(self.name, self.tokenizer, tools)
        return self._bound[key]

    def parse(self, text: str) -> ParsedOutput:
        """Parses one assistant turn; never raises (what cannot be read goes to ``errors``)."""
        try:
            info = self._parser.extract_tool_calls(text, self._request)
            raw_calls = list(info.tool_calls or ())
            content = info.content if isinstance(info.content, str) else ""
        except Exception as e:  # a parser bug or hostile text ends this turn's calls, not the run
            return ParsedOutput(
                text.strip(),
                errors=(
                    f"the {self.name} tool-call parser failed on this turn "
                    f"({type(e).__name__}: {snippet(str(e))}); write the call as the "
                    "chat template shows",
                ),
            )
        calls: list[ToolCall] = []
        errors: list[str] = []
        for n, raw in enumerate(raw_calls, 1):
            call_or_error = self._convert(raw, len(calls))
            if isinstance(call_or_error, ToolCall):
                calls.append(call_or_error)
            else:
                errors.append(f"tool call {n}: {call_or_error}")
        unread = self._unread(text, len(raw_calls))
        if unread:
            errors.append(unread)
        return ParsedOutput(content.strip(), tuple(calls), tuple(errors))

    def _convert(self, raw: Any, index: int) -> ToolCall | str:
        """Our ToolCall for vLLM's ``raw`` call, or the reason it is not one."""
        try:
            name = raw.function.name
            text = raw.function.arguments
            args: Any = json.loads(text) if isinstance(text, str) and text.strip() else text
        except (ValueError, RecursionError) as e:  # also ints past Python's digit limit
            return f"arguments are not valid JSON ({type(e).__name__}: {snippet(str(e))})"
        except Exception as e:
            return f"unreadable call ({type(e).__name__}: {snippet(str(e))})"
        if not isinstance(name, str) or not name.strip():
            return "missing function name"
        if args is None or args == "":
            args = {}
        if not isinstance(args, dict):
            return f"arguments must be a JSON object, got {type(args).__name__}"
        native = getattr(raw.function, "id", None) or getattr(raw, "id", None)
        call_id = (
            native
            if isinstance(native, str) and native and not native.startswith(_RANDOM_ID_PREFIX)
            else f"call_{index}"
        )
        return ToolCall(name=name.strip(), arguments=args, id=call_id)

    def _unread(self, text: str, n_read: int) -> str | None:
        """An error when the text opens more tool calls than the parser read, else None."""
        for marker in self._markers:
            count = text.count(marker)
            if count > n_read:
                at = text.find(marker)
                return (
                    f"the {self.name} tool-call parser could not read the tool call(s) in "
                    f"this turn ({marker!r} appears {count}x, {n_read} call(s) read): "
                    f"{snippet(text[at:])}; write the call exactly as the chat template shows"
                )
        return None


class VLLMReasoningParser:
    """Any reasoning parser registered in vLLM: splits a turn into (reasoning, content).

    Args:
        name: A name in vLLM's ``ReasoningParserManager`` (e.g. "deepseek_r1").
        tokenizer: The policy's Hugging Face tokenizer.

    Raises:
        ValueError: vLLM is not installed, ``name`` is not registered, the
            parser does not accept this tokenizer (e.g. it lacks ``<think>``), or
            it cannot split a finished turn (a stub, like ``openai_gptoss``).
    """

    def __init__(self, name: str, tokenizer: Any) -> None:
        try:
            from vllm.reasoning import ReasoningParserManager
        except ImportError as e:
            raise ValueError(f"reasoning parser {name!r} needs vLLM ({e})") from e
        self.name = name
        self._parser = _build(
            "reasoning",
            name,
            ReasoningParserManager.get_reasoning_parser,
            ReasoningParserManager.list_registered,
            tokenizer,
        )
        self._request = _request(None)
        _require_finished_turns(
            f"vLLM's {name!r} reasoning parser cannot split a finished turn",
            "pick another parser or none" + _GPT_OSS_HINT * (name == "openai_gptoss"),
            lambda: self._parser.extract_reasoning("", self._request),
        )

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of one turn; the whole text is content if the parser fails.

        As in vLLM, a turn with an end-of-thinking marker but no start marker is
        reasoning up to the marker (the template opened the block in the prompt).
        """
        try:
            reasoning, content = self._parser.extract_reasoning(text, self._request)
        except Exception:
            return "", text
        return reasoning or "", content or ""
