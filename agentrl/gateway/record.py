"""What the gateway records of an episode: segments of exact tokens, and the Trajectory they make.

A segment is one contiguous token history: a prompt, then model turns (sampled
ids, loss mask 1, their logprobs and weight versions) and what followed them
(loss mask 0). An episode whose agent rewrote its history has several; they
become the *samples* of one Trajectory (``Trajectory.sample_starts``: positions
restart at each and a sample attends only to itself), so the episode stays one
member of its GRPO group, with one reward, whatever its agent did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.chat.tokenization import ChatTokenizer
from agentrl.types import Message, StopReason, Trajectory, TurnSpan

__all__ = ["Segment", "to_trajectory"]


@dataclass
class Segment:
    """One contiguous token history.

    Attributes:
        kind: "chat" or "text" (``/v1/completions``).
        tools_key: Canonical JSON of the tools rendered into its prompt.
        chat: Renders the template with those tools.
        messages: Chat: the recorded conversation (requests' messages, replies).
        text: Text: the prompt text so far and the replies.
        rewrite: It began because the agent's messages did not extend the record
            (not because the template strategy is ``per_turn``).
    """

    kind: str
    tools_key: str = "[]"
    chat: ChatTokenizer | None = None
    messages: list[Message] = field(default_factory=list)
    text: str = ""
    rewrite: bool = False
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    spans: list[TurnSpan] = field(default_factory=list)
    prompt_length: int = 0
    turns: int = 0

    def add(self, ids: Sequence[int], kind: str) -> None:
        """Appends tokens the model did not sample (loss mask 0)."""
        if not ids:
            return
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))
        self.spans.append(TurnSpan(start, len(self.token_ids), kind))

    def add_model(
        self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int],
        inserted: Sequence[int] = (),
    ) -> None:  # fmt: skip
        """Appends a model turn: sampled tokens with their logprobs and weight versions,
        after ``inserted`` ones the model did not sample (a forced opening; loss mask 0)."""
        start = len(self.token_ids)
        self.token_ids.extend(inserted)
        self.loss_mask.extend([0] * len(inserted))
        self.logprobs.extend([0.0] * len(inserted))
        self.versions.extend([-1] * len(inserted))
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.versions.extend(versions)
        self.spans.append(TurnSpan(start, len(self.token_ids), "model"))
        self.turns += 1


def to_trajectory(
    segments: Sequence[Segment],
    *,
    task_id: str,
    group_id: str,
    episode_id: str,
    reward: float,
    stop_reason: StopReason,
    strategy: str = "as_sampled",
    error: str | None = None,
    metrics: dict[str, float] | None = None,
    info: dict[str, Any] | None = None,
) -> Trajectory:
    """The episode's Trajectory: its segments one after another, each a sample.

    The reward sits on the last model turn. ``messages`` are the last segment's
    conversation (the earlier ones are in ``info["segment_messages"]``).
    """
    segs = [s for s in segments if s.token_ids]
    t = Trajectory(
        task_id=task_id, group_id=group_id, episode_id=episode_id, reward=reward,
        stop_reason=stop_reason, error=error, strategy=strategy,
        metrics=dict(metrics or {}), info=dict(info or {}),
    )  # fmt: skip
    for s in segs:
        offset = len(t.token_ids)
        if segs[0] is not s:
            t.sample_starts = t.sample_starts or [0]
            t.sample_starts.append(offset)
        t.token_ids.extend(s.token_ids)
        t.loss_mask.extend(s.loss_mask)
        t.rollout_logprobs.extend(s.logprobs)
        t.weight_versions.extend(s.versions)
        t.spans.extend(replace(sp, start=sp.start + offset, end=sp.end + offset) for sp in s.spans)
        t.num_turns += s.turns
    if segs:
        t.prompt_length = segs[0].prompt_length
        last = segs[-1]
        t.messages = list(last.messages) if last.kind == "chat" else [Message.user(last.text)]
        if len(segs) > 1:
            t.info["segment_messages"] = [[m.to_dict() for m in s.messages] for s in segs[:-1]]
    model = [sp for sp in t.spans if sp.kind == "model"]
    if model:
        model[-1].reward = reward
    t.metrics["gateway/segments"] = float(len(segs))
    t.validate()
    return t
