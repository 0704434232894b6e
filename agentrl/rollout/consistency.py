"""Checks that a chat template allows exact per-turn (delta) tokenization.

For synthetic multi-turn conversations (tool calls, tool responses, reasoning
blocks, several calls per turn), builds the token sequence the AgentLoop would
build — prompt, then each assistant turn as the model would sample it, then the
delta of the messages after it — and compares it with the tokenization of the
template's rendering of the whole conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.rollout.tokenization import ChatTokenizer, TemplateError
from agentrl.types import Message, ToolCall

__all__ = ["ConsistencyReport", "TurnCheck", "check_chat_template", "synthetic_conversations"]

_PY_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code."}},
            "required": ["code"],
        },
    },
}


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
        ok: The incremental tokens equal the full rendering's tokens so far.
        mismatch_at: First differing token index, or -1.
        diff: Decoded text around the first difference (expected vs got).
    """

    turn: int
    ok: bool
    mismatch_at: int = -1
    diff: str = ""


@dataclass
class ConsistencyReport:
    """Per-conversation, per-turn results of :func:`check_chat_template`."""

    results: dict[str, list[TurnCheck]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors and all(t.ok for ts in self.results.values() for t in ts)

    def summary(self) -> str:
        """Human-readable lines, one per turn checked."""
        lines = []
        for name, turns in self.results.items():
            for t in turns:
                status = "ok" if t.ok else f"MISMATCH at token {t.mismatch_at}\n{t.diff}"
                lines.append(f"[{name}] turn {t.turn}: {status}")
        lines += [f"[{name}] error: {err}" for name, err in self.errors.items()]
        lines.append("prefix-consistent: " + ("yes" if self.ok else "NO"))
        return "\n".join(lines)


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def _check_one(chat: ChatTokenizer, conv: list[Message]) -> list[TurnCheck]:
    first_asst = next(i for i, m in enumerate(conv) if m.role == "assistant")
    ids = chat.prompt_ids(conv[:first_asst])
    checks: list[TurnCheck] = []
    turn = 0
    i = first_asst
    while i < len(conv):
        # The model's turn, as it would have been sampled: the template's text of
        # the assistant message after the generation prompt, up to and including eos.
        before = chat.render(conv[:i], add_generation_prompt=True)
        after = chat.render(conv[: i + 1])
        if not after.startswith(before):
            raise TemplateError(f"rendering turn {turn} changes the text before it")
        sampled = after[len(before) :]
        sampled = sampled[: sampled.rfind(chat.eot_text) + len(chat.eot_text)]
        ids = ids + chat.encode(sampled)
        j = i + 1
        while j < len(conv) and conv[j].role != "assistant":
            j += 1
        expected_text = chat.render(conv[:j], add_generation_prompt=j < len(conv))
        if j < len(conv):
            ids = ids + chat.delta_ids(conv[i + 1 : j])
            expected = chat.encode(expected_text)
        else:
            expected = chat.encode(expected_text)[: len(ids)]
        at = _first_diff(expected, ids)
        diff = ""
        if at >= 0:
            lo = max(0, at - 8)
            diff = (
                f"  expected: {chat.decode(expected[lo : at + 8])!r}\n"
                f"  got:      {chat.decode(ids[lo : at + 8])!r}"
            )
        checks.append(TurnCheck(turn=turn, ok=at < 0, mismatch_at=at, diff=diff))
        turn += 1
        i = j
    return checks


def check_chat_template(
    tokenizer: Any,
    conversations: Sequence[tuple[str, list[Message]]] | None = None,
    tools: Sequence[dict[str, Any]] = (_PY_TOOL,),
) -> ConsistencyReport:
    """Reports, per turn, whether delta tokenization matches the full rendering.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        conversations: (name, messages) pairs; defaults to :func:`synthetic_conversations`.
        tools: Tool schemas rendered into the prompt.

    Returns:
        A report; ``report.ok`` is True when every turn of every conversation matches.
    """
    report = ConsistencyReport()
    try:
        chat = ChatTokenizer(tokenizer, tools=tools)
    except TemplateError as e:
        report.errors["template"] = str(e)
        return report
    for name, conv in conversations or synthetic_conversations():
        try:
            report.results[name] = _check_one(chat, conv)
        except TemplateError as e:
            report.errors[name] = str(e)
    return report
