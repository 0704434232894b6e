"""The run's limits as the gateway applies them, and the pure helpers a session uses: matching
a request against the record, cutting a generation at a stop string."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.chat.tokenization import ChatTokenizer
from agentrl.inference.protocol import Generation
from agentrl.rollout.agent_loop import LoopConfig
from agentrl.types import Message

__all__ = [
    "FORCED_TOOL_CHOICE",
    "GatewayLimits",
    "canon",
    "cut_at_stop",
    "extends",
    "kept",
    "over_budget_message",
]

FORCED_TOOL_CHOICE = ("resample", "prefill")


@dataclass(frozen=True)
class GatewayLimits:
    """The run's limits on what an agent may ask for, and how its model is rendered.

    The episode budgets, sampling defaults and parsers are the AgentLoop's own
    :class:`~agentrl.rollout.LoopConfig` (one source of truth for both kinds of run);
    the rest is what only the gateway needs.

    Attributes:
        loop: Budgets (``max_turns``: most model calls per episode, later calls get a
            ``length`` finish; ``max_total_tokens``: context budget of one segment;
            ``max_tokens_per_turn``: an agent's ``max_tokens`` may only lower it),
            ``sampling`` defaults for what the agent does not send, and the run's
            ``tool_parser`` / ``reasoning_parser``.
        max_temperature: An agent's temperature above this is lowered to it.
        strategy: "as_sampled" or "per_turn" (the template strategy of the run).
        inject_tools: Tool schemas and calls in the Hermes format, for a template
            that drops them (as the AgentLoop does; then ``tool_parser="auto"`` reads
            Hermes).
        model_name: The model id ``GET /v1/models`` lists (any ``model`` is accepted).
        forced_tool_choice: How ``tool_choice`` "required" (or a named function) is
            honoured: "resample" (sample the turn again, up to ``forced_tool_choice_tries``
            times, until it holds a well-formed call of an allowed function) or
            "prefill" (the parser's opening tag, e.g. ``<tool_call>``, is put at the
            start of the turn untrained, then the model continues; resampled as above;
            parsers without an opening tag resample).
        forced_tool_choice_tries: Samples one forced turn may take; the last is kept.
        max_model_len: The servers' context length (``inference.max_model_len``), named
            in the message of a prompt over the budget; None: unknown.
    """

    loop: LoopConfig = field(default_factory=LoopConfig)
    max_temperature: float = 2.0
    strategy: str = "as_sampled"
    inject_tools: bool = False
    model_name: str = "agentrl-policy"
    forced_tool_choice: str = "resample"
    forced_tool_choice_tries: int = 3
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.forced_tool_choice not in FORCED_TOOL_CHOICE:
            raise ValueError(
                f"forced_tool_choice must be one of {FORCED_TOOL_CHOICE}, "
                f"got {self.forced_tool_choice!r}"
            )
        if self.forced_tool_choice_tries < 1:
            raise ValueError("forced_tool_choice_tries must be ≥ 1")

    @property
    def tool_parser(self) -> str:
        """The tool parser the gateway uses: Hermes for injected tools under ``auto``."""
        name = self.loop.tool_parser
        return "hermes" if self.inject_tools and name == "auto" else name


def over_budget_message(prompt_tokens: int, limits: GatewayLimits) -> str:
    """Why a first prompt cannot be sampled from, naming the settings that would let it."""
    budget = limits.loop.max_total_tokens
    msg = (
        f"the episode's first prompt is {prompt_tokens} tokens, and the context budget of an "
        f"episode is rollout.max_total_tokens={budget}: nothing is left to generate. Raise "
        f"rollout.max_total_tokens (to at least {prompt_tokens} + rollout.max_tokens_per_turn"
        f"={prompt_tokens + limits.loop.max_tokens_per_turn})"
    )
    if limits.max_model_len is not None:
        msg += f", and inference.max_model_len (now {limits.max_model_len}) with it if it is lower"
    return msg + ", or shorten the agent's prompt (system prompt, tool schemas)."


def canon(obj: Any) -> str:
    """Canonical JSON (sorted keys): what two equal tool sets or arguments have in common."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def _key(m: Message) -> tuple[Any, ...]:
    calls = tuple((c.name, canon(c.arguments)) for c in m.tool_calls)
    if m.role == "assistant":  # as the gateway returned it; clients drop ids and whitespace
        return ("assistant", m.content.strip(), calls)
    return (m.role, m.content, calls, m.tool_call_id or "", m.name or "")


def extends(recorded: Sequence[Message], request: Sequence[Message]) -> bool:
    """``request`` is ``recorded`` followed by more messages (as the record compares them)."""
    return len(request) >= len(recorded) and all(
        _key(a) == _key(b) for a, b in zip(recorded, request, strict=False)
    )


def cut_at_stop(
    chat: ChatTokenizer, ids: list[int], stops: Sequence[str]
) -> tuple[int, str, str] | None:
    """(tokens to keep, text before the stop string, the stop string) at the first stop
    string, else None."""
    if not stops or not any(s in chat.decode(ids) for s in stops):
        return None
    for k in range(1, len(ids) + 1):
        text = chat.decode(ids[:k])
        hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
        if hits:
            i, s = min(hits)
            return k, text[:i], s
    return None


def kept(
    chat: ChatTokenizer, gen: Generation, stops: Sequence[str]
) -> tuple[Generation, str, str, str | None]:
    """The kept tokens of a generation (cut after a stop string), their text, the finish
    reason and the stop string that cut them."""
    ids = list(gen.token_ids)
    body = ids[:-1] if ids and ids[-1] in chat.eot_ids else ids
    cut = cut_at_stop(chat, body, stops)
    if cut is not None:
        k, text, stop = cut
        gen = replace(
            gen, token_ids=ids[:k], logprobs=gen.logprobs[:k],
            weight_versions=gen.weight_versions[:k],
        )  # fmt: skip
        return gen, text, "stop", stop
    finish = "length" if gen.finish_reason == "length" else "stop"
    return gen, chat.decode(body), finish, None
