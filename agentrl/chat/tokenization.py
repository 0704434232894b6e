"""Chat-template tokenization with per-turn deltas, for any model family's template.

The trajectory keeps the exact token ids the model saw and produced. Model turns
are kept as sampled; tool and env messages are tokenized as a *delta*: only the
new messages are rendered through the chat template, against a small base
conversation, so a turn costs the same however long the history is.

How a delta is made: render ``BASE = [user, assistant]`` (the assistant being the
model's last turn, with its tool calls, so that templates that pair a tool result
with its call — Llama 3.1's ``ipython``, Mistral's ``[TOOL_RESULTS]``, harmony's
``functions.NAME`` — render it), count the end-of-message markers in it, render
``BASE + new`` with the generation prompt and keep what follows the same number of
markers. Counting markers, rather than requiring ``BASE`` to be a prefix, lets a
template rewrite the base's assistant turn (Qwen3 adds an empty ``<think>`` block
only to a *last* assistant turn) without breaking the delta.

What a template accepts is probed once, at construction: its end-of-turn markers
(the tokens the model stops on, e.g. gpt-oss's ``<|call|>`` and ``<|return|>``),
whether tool-call arguments must be a JSON string (DeepSeek-V3.1), whether call
ids must be 9 alphanumeric characters (Mistral; other ids are mapped to such ids
deterministically, on calls and results alike), and whether it takes one call
per turn only (Llama 3.1, gpt-oss).

Whether the deltas add up to the template's rendering of the whole conversation
is a property of the template, checked by
:func:`agentrl.chat.consistency.check_chat_template`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentrl.chat.prompt_cache import PromptCache
from agentrl.chat.template_text import (
    CallStyle,
    fallback_tools_text,
    hermes_call,
    nine_char_id,
    turn_start,
)
from agentrl.types import Message, ToolCall

__all__ = ["ANCHOR", "CallStyle", "ChatTokenizer", "TemplateError", "TemplateRenderError"]

ANCHOR = "Hello."
"""Content of the base conversation's user message."""
_SENT = "Sure."
_PROBE_CALL = ToolCall("python", {"code": "print(1)"}, id="call_0")
_PROBE_CALL2 = ToolCall("python", {"code": "print(2)"}, id="call_1")


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be used for exact multi-turn tokenization."""


class TemplateRenderError(TemplateError):
    """The chat template itself raised while rendering (its own message is kept).

    Attributes:
        template_message: The exception text the template (or jinja) gave.
    """

    def __init__(self, message: str, template_message: str) -> None:
        super().__init__(message)
        self.template_message = template_message


class ChatTokenizer:
    """Renders prompts and per-turn deltas of one model's chat template to token ids.

    Args:
        tokenizer: A Hugging Face tokenizer with a ``chat_template``.
        tools: OpenAI-format tool schemas rendered into the prompt (may be empty).
        inject_tools: For a template that drops tools: put the tool schemas into the
            system message and write tool calls into the assistant text, both in the
            Hermes format (``<tools>`` / ``<tool_call>``), instead of passing them
            to the template.
        template_kwargs: Extra variables for the template (e.g. ``enable_thinking``).

    Raises:
        TemplateError: No chat template, or one whose assistant turn is not closed by
            a special token; :class:`TemplateRenderError` when the template raises on
            a plain user/assistant exchange.

    Example:
        >>> chat = ChatTokenizer(tok, tools=[python_tool.schema()])  # doctest: +SKIP
        >>> ids = chat.prompt_ids([Message.user("2+2?")])  # doctest: +SKIP
        >>> ids += sampled_ids + chat.delta_ids([Message.tool("4")], after=turn)  # doctest: +SKIP
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[dict[str, Any]] = (),
        *,
        inject_tools: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '') or tokenizer!r} has no "
                "chat_template: use a chat/instruct model, or add one (a chat_template.jinja "
                "file in the model directory, or tokenizer.chat_template = ...)"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools)
        self.inject_tools = inject_tools
        self.prompt_cache = PromptCache()  # see prompt_ids
        self.template_kwargs = dict(template_kwargs or {})
        self.style = CallStyle()
        self._specials = sorted(
            {str(s) for s in getattr(tokenizer, "all_special_tokens", ()) if s}
            | {
                str(t.content)
                for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
                if getattr(t, "special", False)
            },
            key=len,
            reverse=True,
        )
        u = Message.user(ANCHOR)
        gen = self.render([u], add_generation_prompt=True, what="a user message")
        last = self.render([u, Message.assistant(_SENT)], what="a plain answer")
        # Where the assistant turn starts: after the generation prompt, or, for a template
        # whose generation prompt opens more than the history keeps (R1's "<think>\n"),
        # after the text both share.
        self.turn_start = turn_start(self._specials, gen, last)
        if self.turn_start <= last.find(ANCHOR):
            raise TemplateError(
                "the chat template renders the user message differently once an assistant turn "
                f"follows it (generation prompt {gen[-60:]!r}, with the turn {last[-60:]!r})"
            )
        eos = getattr(tokenizer, "eos_token", None)
        mid = self.render(
            [u, Message.assistant(_SENT), Message.user(ANCHOR)], what="a second user turn"
        )
        at = mid.find(_SENT, len(gen))
        end_mid = self._first_special(mid, at + len(_SENT)) if at >= 0 else None
        # A closed turn ends with its own token (<|im_end|>, <|eot_id|>, </s>); an open one
        # (GLM) ends where the next message's opener begins (<|user|>, <|observation|>),
        # and the model stops on that opener.
        end_plain = self._closing_special(last[self.turn_start :])
        self.open_turns = end_plain is None
        if self.open_turns:
            end_plain = end_mid
        if end_plain is None:
            raise TemplateError(
                f"the chat template does not close an assistant turn with a special token "
                f"(it renders {last[self.turn_start :]!r}, and nothing special follows it), so the "
                "model could not stop on one. Use a template whose assistant turns end with "
                "the end-of-turn token"
            )
        self.style, end_call = self._probe_calls(u, gen)
        stops = [end_plain] + ([end_call] if end_call else [])
        if eos and eos in self._specials and eos not in stops:
            stops.append(eos)
        self.eot_texts: tuple[str, ...] = tuple(dict.fromkeys(stops))
        self.end_texts: tuple[str, ...] = tuple(
            dict.fromkeys([*self.eot_texts, *([end_mid] if end_mid else [])])
        )
        self.eot_ids: tuple[int, ...] = tuple(
            int(tokenizer.convert_tokens_to_ids(t)) for t in self.eot_texts
        )
        self.eot_text: str = self.eot_texts[0]
        self.eot_id: int = self.eot_ids[0]
        self._end_re = re.compile("|".join(re.escape(t) for t in self.end_texts))
        self._default_base = [u, Message.assistant(_SENT)]

    # --------------------------------------------------------------------- probing

    def _first_special(self, text: str, start: int) -> str | None:
        best: tuple[int, str] | None = None
        for s in self._specials:
            i = text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best[1] if best else None

    def _closing_special(self, text: str) -> str | None:
        """The special token ``text`` ends with (trailing whitespace aside), if any."""
        t = text.rstrip()
        return next((sp for sp in self._specials if t.endswith(sp)), None)

    def _last_special(self, text: str) -> str | None:
        best: tuple[int, str] | None = None
        for s in self._specials:
            i = text.rfind(s)
            if i >= 0 and (best is None or i + len(s) > best[0] + len(best[1])):
                best = (i, s)
        return best[1] if best else None

    def _probe_calls(self, u: Message, gen: str) -> tuple[CallStyle, str | None]:
        msgs = [u, Message.assistant("", (_PROBE_CALL,))]
        error = ""
        for as_string in (False, True):
            for nine in (False, True):
                self.style = CallStyle(as_string, nine)
                try:
                    text = self.render(msgs, what="an assistant tool call")
                except TemplateRenderError as e:
                    error = e.template_message
                    continue
                end = self._call_end(u, msgs[1], text, gen)
                try:
                    self.render(
                        [u, Message.assistant("", (_PROBE_CALL, _PROBE_CALL2))],
                        what="two tool calls in one turn",
                    )
                    single = False
                except TemplateRenderError:
                    single = True
                return CallStyle(as_string, nine, single), end
        return CallStyle(renders_calls=False, error=error), None

    def _call_end(self, u: Message, call_turn: Message, text: str, gen: str) -> str | None:
        """The token a tool-call turn ends on (the results' opener for open turns)."""
        start = turn_start(self._specials, gen, text)
        if not self.open_turns:
            return self._closing_special(text[start:]) or self._last_special(text[start:])
        c = call_turn.tool_calls[0]
        try:
            t3 = self.render(
                [u, call_turn, Message.tool("x", tool_call_id=c.id, name=c.name)],
                what="a tool result",
            )
        except TemplateRenderError:
            return None
        body = text.rstrip()
        return self._first_special(t3, len(body)) if t3.startswith(body) else None

    def turn_end_count(self, text_through_turn: str) -> int:
        """Markers up to and including a model turn's end, given the text through the turn
        as the template renders it (for open turns the model's stop, the next opener, is
        not in that text and is counted here)."""
        return len(self._end_re.findall(text_through_turn)) + (1 if self.open_turns else 0)

    # --------------------------------------------------------------------- rendering

    def _to_dicts(self, messages: Sequence[Message | dict[str, Any]]) -> list[dict[str, Any]]:
        style = self.style
        out: list[dict[str, Any]] = []
        for m in messages:
            msg = m if isinstance(m, Message) else Message.from_dict(m)
            if self.inject_tools and msg.tool_calls:
                text = "\n".join([msg.content, *map(hermes_call, msg.tool_calls)]).lstrip("\n")
                msg = Message.assistant(text)
            d = msg.to_dict()
            if not isinstance(m, Message) and isinstance(m, dict):
                d = {**m, **{k: v for k, v in d.items() if k in ("tool_calls", "tool_call_id")}}
            for c in d.get("tool_calls", ()):
                if style.arguments_as_string and not isinstance(c["function"]["arguments"], str):
                    c["function"]["arguments"] = json.dumps(
                        c["function"]["arguments"], ensure_ascii=False
                    )
                if style.nine_char_ids:
                    c["id"] = nine_char_id(str(c.get("id", "")))
            if style.nine_char_ids and msg.role == "tool":
                d["tool_call_id"] = nine_char_id(msg.tool_call_id or "")
            out.append(d)
        if self.inject_tools and self.tools:
            block = fallback_tools_text(self.tools)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    def render(
        self,
        messages: Sequence[Message | dict[str, Any]],
        *,
        add_generation_prompt: bool = False,
        what: str = "",
    ) -> str:
        """The chat template's text for ``messages``.

        Raises:
            TemplateRenderError: The template raised; the message names what was
                rendered and keeps the template's own words.
        """
        dicts = self._to_dicts(messages)
        try:
            text = self.tokenizer.apply_chat_template(
                dicts,
                tools=(self.tools or None) if not self.inject_tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as e:  # jinja's TemplateError, TypeError, raise_exception(...)
            what = what or ", ".join(d["role"] for d in dicts)
            own = f"{type(e).__name__}: {e}"
            raise TemplateRenderError(
                f"the chat template raised while rendering {what}: {own}", own
            ) from e
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens (tool-call markup) kept."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of a prompt: ``messages`` rendered, ending with the generation prompt.

        The last 256 prompts are remembered (:class:`~agentrl.chat.prompt_cache.PromptCache`):
        a group's G episodes start from the same messages. The key is the messages alone:
        what else a render depends on (tools, ``inject_tools``, the call style, the
        template arguments) is fixed once the tokenizer is built; a copy that changes them
        needs a ``prompt_cache`` of its own.
        """
        key = repr(list(messages))
        ids = self.prompt_cache.get(key)
        if ids is None:
            ids = self.encode(self.render(messages, add_generation_prompt=True))
            self.prompt_cache.put(key, ids)
        return ids

    # --------------------------------------------------------------------- deltas

    def _bases(self, after: Message | None, new: Sequence[Message]) -> list[list[Message]]:
        u = self._default_base[0]
        if after is None:
            # Unknown turn (e.g. the gateway): results answer calls named after them.
            calls = tuple(
                ToolCall(m.name or "tool", {}, id=m.tool_call_id or "")
                for m in new
                if m.role == "tool"
            )
            if not calls:
                return [self._default_base]
            after = Message.assistant("", calls)
        if not after.tool_calls:
            return [self._default_base]
        calls = after.tool_calls
        # The model's own turn first; a template that takes one call per turn gets the
        # first call only; the plain base last (results then render without their call).
        cands = [[u, Message.assistant(after.content, calls)]]
        if len(calls) > 1:
            cands.append([u, Message.assistant("", calls[:1])])
        return [*cands, self._default_base]

    def end_of_turn(self, text: str, count: int) -> int:
        """Index just after the ``count``-th end-of-message marker in ``text`` (-1: fewer)."""
        for i, m in enumerate(self._end_re.finditer(text), 1):
            if i == count:
                return m.end()
        return -1

    def delta_text(self, new_messages: Sequence[Message], *, after: Message | None = None) -> str:
        """Text that follows a model turn (ended by its end-of-turn token) when
        ``new_messages`` are appended, through the next generation prompt.

        Args:
            new_messages: Tool results and env messages after the model's turn.
            after: The model's turn they answer (its tool calls pair the results
                in templates that need it); a plain base is used when None.

        Raises:
            TemplateError: The template raised on every base, or the model turn's
                end could not be found in the rendering.
        """
        err: TemplateError | None = None
        for base in self._bases(after, new_messages):
            try:
                base_text = self.render(base)
                full = self.render([*base, *new_messages], add_generation_prompt=True)
            except TemplateRenderError as e:
                err = e
                continue
            n = self.turn_end_count(base_text)
            cut = self.end_of_turn(full, n)
            if cut < 0:
                raise TemplateError(
                    "cannot isolate the delta: the rendering with the new messages has fewer "
                    f"end-of-message markers ({', '.join(self.end_texts)}) than the model turn "
                    "before them"
                )
            return full[cut:]
        assert err is not None
        raise err

    def delta_ids(
        self, new_messages: Sequence[Message], *, after: Message | None = None
    ) -> list[int]:
        """Token ids that follow a model turn when ``new_messages`` are appended."""
        return self.encode(self.delta_text(new_messages, after=after))

    def content_of(self, sampled_ids: Sequence[int]) -> str:
        """The assistant text of a sampled turn, without its trailing end-of-turn token."""
        ids = list(sampled_ids)
        if ids and ids[-1] in self.eot_ids:
            ids = ids[:-1]
        return self.decode(ids)
