"""Multi-stage turns: several generations with different sampling inside one model turn.

A turn made of stages (OpenOneRec's pattern: think until ``</think>`` at temperature
1.0, then answer at 0.3 within a fixed budget) is still one assistant message and
one ``model`` span of the trajectory. Every sampled token keeps the logprob and the
weight version its own request returned, and is trainable (loss mask 1); text that
agentrl inserts between stages (e.g. a closing ``</think>`` after a stage that ran
out of its budget) is recorded with loss mask 0, as a tool output would be.

A stage's stop strings must each be one token of the policy's vocabulary
(``</think>`` is one in Qwen3, DeepSeek-R1 and agentrl's tiny model): they are sent
as ``stop_token_ids``, so the stage ends exactly on that token, which the model
sampled and which is trained like any other.

Example:
    >>> THINK_THEN_ANSWER = (
    ...     Stage(name="think", stop=("</think>",), temperature=1.0, on_budget="</think>"),
    ...     Stage(name="answer", temperature=0.3, max_tokens=64),
    ... )
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrl.inference.protocol import Generation, LLMClient, SamplingParams
from agentrl.rollout.roles import adapter_kwargs

__all__ = [
    "Piece",
    "Stage",
    "StagePlan",
    "StagePlans",
    "StagedTurn",
    "generate_staged",
    "generate_turn",
    "plan_stages",
]


@dataclass(frozen=True)
class Stage:
    """One generation inside a model turn.

    Attributes:
        name: For metrics and the trajectory's info (``stage_tokens/<name>``).
        stop: Strings that end this stage (each one token of the policy's vocabulary);
            the turn's own end-of-turn tokens always end the whole turn.
        stop_token_ids: Token ids that end this stage, beside ``stop``.
        temperature: Sampling temperature of this stage (None: the loop's).
        top_p: Nucleus mass of this stage (None: the loop's).
        top_k: Top-k of this stage (None: the loop's).
        max_tokens: Most tokens this stage may sample (None: what is left of the
            turn's budget).
        on_budget: Text inserted (loss mask 0) when this stage ran out of its own
            ``max_tokens`` before a stop, e.g. ``"</think>"``; the next stage follows it.
        after: Text inserted (loss mask 0) whenever this stage ends on one of its
            stops and the next stage follows, e.g. ``"\\n"``.
    """

    name: str = ""
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    on_budget: str = ""
    after: str = ""

    def __post_init__(self) -> None:
        # Lists (from a config file) become tuples, so a Stage stays hashable.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"stage {self.name!r}: max_tokens must be ≥ 1, got {self.max_tokens}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"stage {self.name!r}: temperature must be ≥ 0")


@dataclass(frozen=True)
class StagePlan:
    """Stages resolved against a tokenizer: stop ids and inserted texts as token ids."""

    stages: tuple[Stage, ...]
    stop_ids: tuple[tuple[int, ...], ...]
    on_budget_ids: tuple[tuple[int, ...], ...]
    after_ids: tuple[tuple[int, ...], ...]


def _single_token(tokenizer: Any, text: str, stage: Stage) -> int:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if len(ids) != 1:
        raise ValueError(
            f"stage {stage.name!r}: stop {text!r} is {len(ids)} tokens of this tokenizer, "
            "not one; give a string that is a single token (e.g. a special token such as "
            "'</think>') or its id in stop_token_ids"
        )
    return int(ids[0])


def plan_stages(stages: Sequence[Stage], tokenizer: Any) -> StagePlan:
    """Resolves ``stages`` against the policy's tokenizer.

    Raises:
        ValueError: No stages, or a stop string that is not a single token.
    """
    if not stages:
        raise ValueError("a multi-stage turn needs at least one stage")
    stop_ids = []
    for s in stages:
        ids = [_single_token(tokenizer, text, s) for text in s.stop]
        stop_ids.append(tuple(dict.fromkeys([*ids, *s.stop_token_ids])))

    def enc(text: str) -> tuple[int, ...]:
        return tuple(int(i) for i in tokenizer.encode(text, add_special_tokens=False))

    return StagePlan(
        stages=tuple(stages),
        stop_ids=tuple(stop_ids),
        on_budget_ids=tuple(enc(s.on_budget) for s in stages),
        after_ids=tuple(enc(s.after) for s in stages),
    )


class StagePlans:
    """Plans of the stage lists a loop meets (its config's, its envs'), made once each."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._plans: dict[tuple[Stage, ...], StagePlan] = {}

    def get(self, stages: Sequence[Stage]) -> StagePlan | None:
        """The plan of ``stages`` (None for none). Raises ValueError as :func:`plan_stages`."""
        key = tuple(stages)
        if not key:
            return None
        if key not in self._plans:
            self._plans[key] = plan_stages(key, self.tokenizer)
        return self._plans[key]


@dataclass(frozen=True)
class Piece:
    """A run of a turn's tokens: sampled by one request (trainable) or inserted (not).

    Attributes:
        token_ids: The tokens.
        logprobs: Sampling logprobs (0.0 for inserted tokens).
        weight_versions: Version of each token (-1 for inserted tokens).
        trainable: Sampled by the model (loss mask 1) or inserted by agentrl (0).
        stage: Index of the stage that sampled it (or that it follows, if inserted).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...]
    trainable: bool
    stage: int


@dataclass(frozen=True)
class StagedTurn:
    """One model turn generated stage by stage.

    Attributes:
        pieces: In order; together they are the turn's tokens.
        finish_reason: The last request's ("stop", "length" or "abort").
        cut: The turn ran out of its budget (or was aborted) before ending.
    """

    pieces: tuple[Piece, ...]
    finish_reason: str
    cut: bool

    @property
    def token_ids(self) -> list[int]:
        return [t for p in self.pieces for t in p.token_ids]

    @classmethod
    def single(cls, gen: Generation) -> StagedTurn:
        """A turn of one plain request.

        Raises:
            ValueError: The answer's lengths disagree.
        """
        piece = _sampled(gen, 0)
        cut = gen.finish_reason != "stop" or not gen.token_ids
        return cls((piece,) if piece.token_ids else (), gen.finish_reason, cut)


def _sampled(gen: Generation, stage: int) -> Piece:
    n = len(gen.token_ids)
    if len(gen.logprobs) != n:
        raise ValueError(f"server returned {n} tokens but {len(gen.logprobs)} logprobs")
    versions = gen.weight_versions or [0] * n
    if len(versions) != n:
        raise ValueError("weight_versions and token_ids differ in length")
    return Piece(tuple(gen.token_ids), tuple(gen.logprobs), tuple(versions), True, stage)


def _inserted(ids: tuple[int, ...], stage: int) -> Piece:
    return Piece(ids, (0.0,) * len(ids), (-1,) * len(ids), False, stage)


async def generate_turn(
    llm: LLMClient,
    context: Sequence[int],
    sampling: SamplingParams,
    budget: int,
    plan: StagePlan | None,
    end_ids: Sequence[int],
    *,
    session_id: str | None = None,
    adapter_role: str | None = None,
) -> StagedTurn:
    """One model turn: one request without a plan, else :func:`generate_staged`."""
    if plan is None:
        params = replace(sampling, max_tokens=budget)
        gen = await llm.generate(
            context, params, session_id=session_id, **adapter_kwargs(adapter_role)
        )
        return StagedTurn.single(gen)
    return await generate_staged(
        llm, context, sampling, budget, plan, end_ids, session_id=session_id,
        adapter_role=adapter_role,
    )  # fmt: skip


async def generate_staged(
    llm: LLMClient,
    context: Sequence[int],
    sampling: SamplingParams,
    budget: int,
    plan: StagePlan,
    end_ids: Sequence[int],
    *,
    session_id: str | None = None,
    adapter_role: str | None = None,
) -> StagedTurn:
    """Generates one turn as the stages of ``plan``, each request continuing the last.

    Args:
        llm: The client.
        context: The tokens before the turn.
        sampling: The loop's sampling parameters (its stop ids end the turn).
        budget: Most tokens of the whole turn, inserted ones included.
        plan: From :func:`plan_stages`.
        end_ids: Tokens that end the turn (end of turn / EOS): any stage that samples
            one ends the turn; the later stages do not run.
        session_id: For sticky routing.
        adapter_role: The env's role for this turn: every stage asks for its adapter.

    Raises:
        agentrl.inference.protocol.LLMError: A request failed for good.
        ValueError: A server answer whose lengths disagree.
    """
    pieces: list[Piece] = []
    used = 0
    ends = set(end_ids) | set(sampling.stop_token_ids)
    last = len(plan.stages) - 1
    finish = "length"
    for i, stage in enumerate(plan.stages):
        left = budget - used
        limit = min(stage.max_tokens or left, left)
        if limit <= 0:
            return StagedTurn(tuple(pieces), "length", True)
        params = replace(
            sampling,
            max_tokens=limit,
            temperature=sampling.temperature if stage.temperature is None else stage.temperature,
            top_p=sampling.top_p if stage.top_p is None else stage.top_p,
            top_k=sampling.top_k if stage.top_k is None else stage.top_k,
            stop_token_ids=tuple(dict.fromkeys([*sampling.stop_token_ids, *plan.stop_ids[i]])),
        )
        prompt = [*context, *(t for p in pieces for t in p.token_ids)]
        gen = await llm.generate(
            prompt, params, session_id=session_id, **adapter_kwargs(adapter_role)
        )
        piece = _sampled(gen, i)
        if piece.token_ids:
            pieces.append(piece)
        used += len(piece.token_ids)
        finish = gen.finish_reason
        ended_turn = finish == "stop" and bool(piece.token_ids) and piece.token_ids[-1] in ends
        if i == last or ended_turn or finish == "abort" or not piece.token_ids:
            break
        if finish == "stop":
            insert = plan.after_ids[i]
        elif limit < left:  # the stage's own budget ran out, not the turn's
            insert = plan.on_budget_ids[i]
        else:
            return StagedTurn(tuple(pieces), finish, True)
        if insert:
            if used + len(insert) >= budget:  # no room for the next stage after it
                return StagedTurn(tuple(pieces), "length", True)
            pieces.append(_inserted(insert, i))
            used += len(insert)
    cut = finish != "stop" or not pieces
    return StagedTurn(tuple(pieces), finish, cut)
