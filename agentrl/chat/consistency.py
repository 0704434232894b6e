"""Checks how a chat template can be trained on: exactly, ``as_sampled`` or ``per_turn``.

For synthetic multi-turn conversations (tool calls, tool responses, reasoning
blocks, several calls per turn, env feedback), builds the token sequence the
AgentLoop would build — prompt, then each assistant turn as the model would
sample it, then the delta of the messages after it — and compares it with what
the template gives:

- **exact**: the sequence equals the tokenization of the template's rendering of
  the whole conversation (the prompt inference would show for the next turn).
  A template that rewrites history (drops earlier reasoning, moves the tools
  block, closes a message differently once another follows) is not exact; the
  first difference is shown.
- **as_sampled** holds when every delta equals what the template renders for the
  new messages *in that position* (after the model's turn, at the end of the
  conversation so far): training then uses exactly the tokens the model saw.
- **per_turn** holds when every prompt renders and each model turn follows its
  generation prompt: each turn is then trained as its own sample whose prompt is
  the template's rendering of the conversation so far.

A template that raises on a probe is reported (which probe, the template's own
message), never a crash; probes adapt to what a template accepts (one call per
turn, 9-character ids, arguments as a JSON string: see
:class:`agentrl.chat.template_text.CallStyle`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat.capabilities import PY_TOOL, Capabilities, probe_capabilities
from agentrl.chat.template_text import turn_start
from agentrl.chat.tokenization import ChatTokenizer, TemplateError, TemplateRenderError
from agentrl.types import Message, ToolCall

__all__ = [
    "PY_TOOL",
    "ConsistencyReport",
    "TurnCheck",
    "check_chat_template",
    "synthetic_conversations",
]

_PY_TOOL = PY_TOOL  # kept for older imports
_THINK = re.compile(r"<think>(.*?)</think>", re.S)


def synthetic_conversations() -> list[tuple[str, list[Message]]]:
    """Named conversations that exercise what multi-turn agent rollouts contain."""
    call = ToolCall("python", {"code": "print(12345 * 6789)"}, id="call_0")
    call2 = ToolCall("python", {"code": "print(2 ** 10)"}, id="call_1")
    return [
        (
            "single tool call",
            [
                Message.system("You are a careful assistant."),
                Message.user("What is 12345 * 6789?"),
                Message.assistant("", (call,)),
                Message.tool("83810205", tool_call_id="call_0", name="python"),
                Message.assistant("The answer is \\boxed{83810205}."),
            ],
        ),
        (
            "two calls in one turn",
            [
                Message.user("Compute two things."),
                Message.assistant("Let me run both.", (call, call2)),
                Message.tool("83810205", tool_call_id="call_0", name="python"),
                Message.tool("1024", tool_call_id="call_1", name="python"),
                Message.assistant("Done: 83810205 and 1024."),
            ],
        ),
        (
            "reasoning blocks over several turns",
            [
                Message.user("Think, then use the tool."),
                Message.assistant("<think>I should compute it.</think>Running.", (call,)),
                Message.tool("83810205", tool_call_id="call_0", name="python"),
                Message.assistant("<think>Check once more.</think>", (call2,)),
                Message.tool("1024", tool_call_id="call_1", name="python"),
                Message.assistant("<think>Both done.</think>\\boxed{83810205}"),
            ],
        ),
        (
            "reasoning with env feedback",
            [
                Message.user("Guess a number from 1 to 10."),
                Message.assistant("<think>Start in the middle.</think>5"),
                Message.user("Too low."),
                Message.assistant("<think>Between 6 and 10.</think>8"),
            ],
        ),
        (
            "env feedback as user turns",
            [
                Message.user("Guess a number from 1 to 10."),
                Message.assistant("5"),
                Message.user("Too low."),
                Message.assistant("8"),
                Message.user("Correct!"),
                Message.assistant("Thanks."),
            ],
        ),
    ]


@dataclass(frozen=True)
class TurnCheck:
    """Result for one model turn of one conversation.

    Attributes:
        turn: Index of the assistant turn (0-based).
        ok: The incremental tokens equal the full rendering's tokens so far (exact).
        mismatch_at: First differing token index, or -1.
        diff: Decoded text around the first difference (expected vs got).
        delta_ok: The delta after this turn equals the template's text for the new
            messages in that position (``as_sampled`` holds for this turn).
        delta_diff: Where it does not: the two texts.
    """

    turn: int
    ok: bool
    mismatch_at: int = -1
    diff: str = ""
    delta_ok: bool = True
    delta_diff: str = ""


@dataclass
class ConsistencyReport:
    """Per-conversation, per-turn results of :func:`check_chat_template`.

    Attributes:
        results: Conversation name → per-turn checks.
        errors: Conversation name → why it could not be checked (a template error).
        skipped: Conversation name → why it was not applicable (e.g. one call per turn).
        notes: Other findings (e.g. the reasoning of the turn itself is dropped).
        per_turn_ok: Every prompt rendered and every model turn followed its
            generation prompt.
        capabilities: What the template renders and drops (None: not probed).
        inject_tools: Whether the check ran with the Hermes tools fallback, as a run
            with the same ``rollout.inject_tools`` would.
        lacks: What the model would not see in such a run (tool schemas or calls
            dropped with ``inject_tools`` off), with the setting that fixes it.
    """

    results: dict[str, list[TurnCheck]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    per_turn_ok: bool = True
    capabilities: Capabilities | None = None
    inject_tools: bool = False
    lacks: list[str] = field(default_factory=list)

    @property
    def checked(self) -> bool:
        """At least one conversation was checked."""
        return bool(self.results)

    @property
    def tokens_ok(self) -> bool:
        """Exact: every turn of every conversation matches and nothing else differs."""
        return (
            self.checked
            and not self.errors
            and not self.notes
            and all(t.ok for ts in self.results.values() for t in ts)
        )

    @property
    def ok(self) -> bool:
        """Exact (:attr:`tokens_ok`), and the model sees the tools it is given."""
        return self.tokens_ok and not self.lacks

    @property
    def as_sampled_ok(self) -> bool:
        """Every delta equals the template's rendering of its messages in position."""
        return (
            self.checked
            and not self.errors
            and all(t.delta_ok for ts in self.results.values() for t in ts)
        )

    def summary(self) -> str:
        """Human-readable lines, one per turn checked."""
        lines = []
        for name, turns in self.results.items():
            if all(t.ok and t.delta_ok for t in turns):
                lines.append(f"[{name}] {len(turns)} turns: ok")
            first = next((t for t in turns if not t.ok), None)  # later turns repeat it
            for t in turns:
                if t is first:
                    lines.append(f"[{name}] turn {t.turn}: differs at token {t.mismatch_at}")
                    lines.append(t.diff)
                if not t.delta_ok:
                    lines.append(f"[{name}] turn {t.turn}: delta not isolated")
                    lines.append(t.delta_diff)
        lines += [f"[{name}] skipped: {why}" for name, why in self.skipped.items()]
        lines += [f"[{name}] error: {err}" for name, err in self.errors.items()]
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"lacks: {what}" for what in self.lacks]
        lines.append("prefix-consistent: " + ("yes" if self.tokens_ok else "NO"))
        return "\n".join(lines)


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def _sampled_text(chat: ChatTokenizer, turn_text: str, following: str = "") -> str:
    """The model's turn: the template's assistant text up to and including its last stop
    token; for open turns (GLM) the text plus the opener of what follows (``following``:
    the rendering after the turn), or the first stop token at the end of a conversation."""
    if chat.open_turns:
        t = turn_text.rstrip()
        nxt = next((e for e in chat.eot_texts if following.lstrip().startswith(e)), None)
        return t + (nxt or chat.eot_text)
    cut = max((turn_text.rfind(t) + len(t) for t in chat.eot_texts if t in turn_text), default=-1)
    if cut < 0:
        raise TemplateError(
            f"the rendered assistant turn {turn_text[-60:]!r} contains no end-of-turn token "
            f"({', '.join(chat.eot_texts)})"
        )
    return turn_text[:cut]


def _turn_alone(chat: ChatTokenizer, message: Message, report: ConsistencyReport, name: str) -> str:
    """The model's turn in the minimal conversation [user, turn]: after the generation
    prompt, or after the text both share when the prompt opens more than the history keeps."""
    u = Message.user("Hello.")
    gen = chat.render([u], add_generation_prompt=True)
    text = chat.render([u, message])
    start = turn_start(chat._specials, gen, text)
    if start < len(gen):
        note = (
            f"[{name}] the generation prompt opens the turn with {gen[start:]!r}, which the "
            "history does not keep"
        )
        if note not in report.notes:
            report.notes.append(note)
    return text[start:]


def _check_one(
    chat: ChatTokenizer, conv: list[Message], report: ConsistencyReport, name: str
) -> list[TurnCheck]:
    first_asst = next(i for i, m in enumerate(conv) if m.role == "assistant")
    ids = chat.prompt_ids(conv[:first_asst])
    checks: list[TurnCheck] = []
    turn = 0
    i = first_asst
    while i < len(conv):
        # The model's turn, as it would have been sampled: the template's text of the
        # assistant message after the generation prompt, up to and including its stop token.
        before = chat.render(conv[:i], add_generation_prompt=True)
        after = chat.render(conv[: i + 1])
        j = i + 1
        while j < len(conv) and conv[j].role != "assistant":
            j += 1
        expected_text = chat.render(conv[:j], add_generation_prompt=j < len(conv))
        if after.startswith(before):
            turn_text = after[len(before) :]
            following = ""
            if chat.open_turns and j > i + 1 and expected_text.startswith(after.rstrip()):
                following = expected_text[len(after.rstrip()) :]
            sampled = _sampled_text(chat, turn_text, following)
            n = len(chat._end_re.findall(before + sampled))
        else:
            # The template renders the context differently once the turn follows it
            # (Mistral's system prompt goes with the last message only; Hermes closes a
            # tool message differently when another follows): take the model's turn from
            # the minimal conversation [user, assistant], where it follows the prompt.
            report.notes.append(
                f"[{name}] turn {turn}: the prompt is rendered differently once the model's "
                f"turn follows it (prompt ends {before[-50:]!r}; with the turn: "
                f"{after[max(0, len(before) - 50) : len(before)]!r})"
            )
            sampled = _sampled_text(chat, _turn_alone(chat, conv[i], report, name))
            n = chat.turn_end_count(after)
        for reasoning in _THINK.findall(conv[i].content):
            if reasoning.strip() and reasoning.strip() not in sampled:
                report.notes.append(
                    f"[{name}] turn {turn}: the template does not render this turn's reasoning "
                    f"({reasoning.strip()[:30]!r}), so what the model samples there never "
                    "appears in the prompts inference shows"
                )
        ids = ids + chat.encode(sampled)
        delta_ok, delta_diff = True, ""
        if j < len(conv):
            delta = chat.delta_text(conv[i + 1 : j], after=conv[i])
            # What the template renders for the new messages in this position: the text
            # after the model turn's end in the rendering of the conversation so far.
            cut = chat.end_of_turn(expected_text, n)
            in_position = expected_text[cut:] if cut >= 0 else ""
            if cut < 0 or in_position != delta:
                delta_ok = False
                delta_diff = f"  template: {in_position!r}\n  delta:    {delta!r}"
            ids = ids + chat.encode(delta)
            expected = chat.encode(expected_text)
        else:
            expected = chat.encode(expected_text)[: len(ids)]
        at = _first_diff(expected, ids)
        diff = ""
        if at >= 0:
            lo = max(0, at - 8)
            diff = (
                f"  inference: {chat.decode(expected[lo : at + 8])!r}\n"
                f"  as sampled: {chat.decode(ids[lo : at + 8])!r}"
            )
        checks.append(TurnCheck(turn, at < 0, at, diff, delta_ok, delta_diff))
        turn += 1
        i = j
    return checks


def check_chat_template(
    tokenizer: Any,
    conversations: Sequence[tuple[str, list[Message]]] | None = None,
    tools: Sequence[dict[str, Any]] = (PY_TOOL,),
    *,
    inject_tools: bool | None = None,
    chat: ChatTokenizer | None = None,
) -> ConsistencyReport:
    """Reports, per turn, whether delta tokenization matches the template, as a run uses it.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        conversations: (name, messages) pairs; defaults to :func:`synthetic_conversations`.
        tools: Tool schemas rendered into the prompt.
        inject_tools: The Hermes tools fallback (see :class:`ChatTokenizer`); None
            resolves it as a run's ``rollout.inject_tools: null`` does (on when the
            template drops tool schemas or calls), so the check covers what training sees.
        chat: A ChatTokenizer to use instead of building one (its own ``inject_tools``).

    Returns:
        A report: ``ok`` (exact, and nothing the model is given is dropped),
        ``tokens_ok``, ``as_sampled_ok``, ``per_turn_ok``; the probed ``capabilities``
        and what the run would lack (``lacks``); template errors are in ``errors``
        (under "template" when no ChatTokenizer could be built).

    Example (SmolLM2's ChatML drops tools; the default checks the injected rendering)::

        report = check_chat_template(tokenizer)
        print(report.summary())  # "... tool schemas DROPPED, tool calls DROPPED ..."
    """
    report = ConsistencyReport()
    try:
        if chat is None:
            plain = ChatTokenizer(tokenizer, tools=tools)
            caps = probe_capabilities(plain)
            inject = caps.drops_tools if inject_tools is None else inject_tools
            chat = ChatTokenizer(tokenizer, tools=tools, inject_tools=True) if inject else plain
        else:
            caps, inject = probe_capabilities(chat), chat.inject_tools
    except TemplateError as e:
        report.errors["template"] = str(e)
        report.per_turn_ok = False
        return report
    report.capabilities, report.inject_tools = caps, inject
    if caps.drops_tools and not inject:
        dropped = " and ".join(
            what
            for what, kept in (("tool schemas", caps.tool_schemas), ("tool calls", caps.tool_calls))
            if kept is False
        )
        report.lacks.append(
            f"the template drops {dropped} and inject_tools is off: the model never sees "
            "its tools; set rollout.inject_tools: true (or leave it unset)"
        )
    for name, conv in conversations or synthetic_conversations():
        calls = [m.tool_calls for m in conv if m.tool_calls]
        if calls and not chat.style.renders_calls and not inject:
            report.skipped[name] = f"the template raises on tool calls ({chat.style.error})"
            continue
        if chat.style.single_call and any(len(c) > 1 for c in calls):
            report.skipped[name] = "the template takes one tool call per turn"
            continue
        try:
            report.results[name] = _check_one(chat, conv, report, name)
        except TemplateRenderError as e:
            report.errors[name] = str(e)
            report.per_turn_ok = False
        except TemplateError as e:
            report.errors[name] = str(e)
    return report
