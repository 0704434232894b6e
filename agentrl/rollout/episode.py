"""The state of one running episode, as an object: what the AgentLoop carries from turn to turn.

:class:`Episode` holds everything one turn needs (the trajectory record, the env, the chat
tokenizer, the parser and tool executor bound to the env's tools, the sampling settings,
the turn counter); :meth:`agentrl.rollout.AgentLoop.play_turn` advances it by one model
turn. Keeping it explicit is what lets a tree rollout (``agentrl.rollout.tree``) fork an
episode between turns: a deep copy of the record, a forked env, the same settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agentrl.chat.tokenization import ChatTokenizer
from agentrl.env import Env
from agentrl.inference.protocol import SamplingParams
from agentrl.rollout.stages import StagePlan
from agentrl.tools import ToolExecutor
from agentrl.tools.sanitize import scrub_messages
from agentrl.types import Message, StopReason, Trajectory

__all__ = ["Episode", "EpisodeEnd", "EpisodeState"]


class EpisodeState(StrEnum):
    """States of one episode."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


class EpisodeEnd(Exception):
    """Ends an episode with ``reason`` (and ``error``, the recorded why)."""

    def __init__(self, reason: StopReason, error: str | None = None) -> None:
        super().__init__(reason, error)
        self.reason = reason
        self.error = error


@dataclass
class Episode:
    """One episode between turns.

    Attributes:
        traj: The record so far.
        env: The episode's env (this episode owns it and closes it once).
        session_id: Sent with every request, so a router keeps the episode (and, in a
            tree, every branch of it) on one server and its prefix cache.
        chat, parser, executor: The chat tokenizer and the tool-call parser and executor
            bound to ``env``'s tools (set by ``AgentLoop.start_episode``).
        sampling: Sampling parameters with the family's extra stop tokens.
        plan: Multi-stage plan of each turn (None: one request per turn).
        sample_start: Where the current sample starts (``per_turn`` templates).
        per_turn: Whether each model turn is its own sample.
        turn: Model turns played.
        max_turns: Most model turns (the loop's and the env's limit).
    """

    traj: Trajectory
    env: Env
    session_id: str
    chat: ChatTokenizer | None = None
    parser: Any = None
    executor: ToolExecutor | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    plan: StagePlan | None = None
    sample_start: int = 0
    per_turn: bool = False
    turn: int = 0
    max_turns: int = 0


def as_messages(obs: Any, where: str) -> list[Message]:
    """An env's observation as chat messages (a str is one user message)."""
    if isinstance(obs, str):
        return [Message.user(obs)]
    if isinstance(obs, Message):
        return [obs]
    if isinstance(obs, Sequence) and all(isinstance(m, Message | dict) for m in obs):
        return [m if isinstance(m, Message) else Message.from_dict(m) for m in obs]
    raise TypeError(f"{where} must return a str or a list of Message, got {type(obs).__name__}")


def scrub(traj: Trajectory, messages: list[Message]) -> list[Message]:
    """Env messages with lone surrogates replaced (they would break tokenization), counted."""
    messages, replaced = scrub_messages(messages)
    if replaced:
        traj.metrics["env_text_replaced"] = traj.metrics.get("env_text_replaced", 0.0) + replaced
    return messages
