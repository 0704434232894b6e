"""Core data types shared by every layer: messages, actions, step results, trajectories.

This module imports nothing else from agentrl; everything else may import it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "Action",
    "Message",
    "StepResult",
    "StopReason",
    "ToolCall",
    "Trajectory",
    "TurnSpan",
]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for.

    Attributes:
        name: The tool's name.
        arguments: Parsed JSON arguments.
        id: A call id, unique within the episode (used to pair the response).
    """

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """OpenAI-style dict, as chat templates expect it."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Message:
    """One chat message.

    Attributes:
        role: "system", "user", "assistant" or "tool".
        content: The text.
        tool_calls: Tool calls of an assistant message.
        tool_call_id: For a tool message, the id of the call it answers.
        name: For a tool message, the tool's name.
        reasoning: For an assistant message, its reasoning (thinking) text, split
            off by a reasoning parser; templates that render thinking read it as
            ``reasoning_content``. Empty for models that do not think.

    Example:
        >>> Message.user("What is 2+2?").role
        'user'
    """

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str = ""

    @classmethod
    def system(cls, content: str) -> Message:
        return cls("system", content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: str, tool_calls: tuple[ToolCall, ...] = ()) -> Message:
        return cls("assistant", content, tuple(tool_calls))

    @classmethod
    def tool(cls, content: str, *, tool_call_id: str = "", name: str | None = None) -> Message:
        return cls("tool", content, tool_call_id=tool_call_id, name=name)

    def to_dict(self) -> dict[str, Any]:
        """The dict a Hugging Face chat template takes."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        if self.reasoning:
            d["reasoning_content"] = self.reasoning
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        """Builds a message from an OpenAI/HF-style dict (arguments may be a JSON string)."""
        calls = []
        for c in d.get("tool_calls") or ():
            fn = c.get("function", c)
            args = fn.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args) if args else {}
            calls.append(ToolCall(name=fn["name"], arguments=args, id=c.get("id", "")))
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=tuple(calls),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            reasoning=d.get("reasoning_content") or d.get("reasoning") or "",
        )


@dataclass(frozen=True)
class Action:
    """What the model did in one turn: its text and the tool calls parsed from it.

    Attributes:
        text: The decoded assistant text (tool-call markup and reasoning included).
        content: The text with tool-call markup and reasoning removed.
        tool_calls: Well-formed tool calls, in order.
        tool_results: Tool messages produced by running ``tool_calls`` (and by
            malformed calls), filled in by the AgentLoop before ``env.step``.
        finish_reason: "stop", "length" or "abort", as the server reported it.
        parse_errors: One message per malformed tool call.
        last_turn: The loop's turn budget ends after this turn: an env that scores
            at the end (e.g. runs tests) should do so now.
        reasoning: The turn's reasoning (thinking) text, split off by the
            configured reasoning parser (``rollout.reasoning_parser``); "" without one.
    """

    text: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[Message, ...] = ()
    finish_reason: str = "stop"
    parse_errors: tuple[str, ...] = ()
    last_turn: bool = False
    reasoning: str = ""

    def to_message(self) -> Message:
        """The assistant message this action stands for (its reasoning included, for
        templates that render thinking in the conversation history)."""
        return Message("assistant", self.content, tuple(self.tool_calls), reasoning=self.reasoning)


class StopReason(StrEnum):
    """Why an episode ended."""

    DONE = "done"
    """The env said terminated."""
    TRUNCATED = "truncated"
    """The env said truncated (its own limit)."""
    MAX_TURNS = "max_turns"
    """The loop's turn budget ran out."""
    MAX_TOKENS = "max_tokens"
    """The token budget ran out (context or generation)."""
    TIMEOUT = "timeout"
    """The episode's wall-clock budget ran out."""
    ENV_ERROR = "env_error"
    """The env raised in reset or step; the traceback is in ``Trajectory.error``."""
    LLM_ERROR = "llm_error"
    """The inference server failed for good (after safe retries)."""
    TOKENIZATION_ERROR = "tokenization_error"
    """The chat template is not prefix-consistent for this conversation."""
    ABORTED = "aborted"
    """The run was cancelled while the episode was in flight."""
    INTERNAL_ERROR = "internal_error"
    """A bug in agentrl itself; the traceback is in ``Trajectory.error``."""
    AGENT_ERROR = "agent_error"
    """A bring-your-own agent's ``solve`` raised; the traceback is in ``Trajectory.error``."""
    REWARD_ERROR = "reward_error"
    """The reward model could not score the episode (server down, timeout, too long); the
    reason is in ``Trajectory.error``. Not trained on."""

    @property
    def is_failure(self) -> bool:
        """The episode broke for a reason that is not the policy's doing (not trained on)."""
        return self in _FAILURES


_FAILURES = frozenset(
    {
        StopReason.ENV_ERROR,
        StopReason.LLM_ERROR,
        StopReason.INTERNAL_ERROR,
        StopReason.TOKENIZATION_ERROR,
        StopReason.ABORTED,
        StopReason.AGENT_ERROR,
        StopReason.REWARD_ERROR,
    }
)


@dataclass(frozen=True)
class StepResult:
    """What ``Env.step`` returns.

    Attributes:
        observation: Messages to append to the conversation (may be empty).
        reward: Reward for the action just taken.
        terminated: The task reached an end state (gymnasium semantics).
        truncated: The env cut the episode short for its own reason.
        metrics: Numbers to aggregate into the run's metrics.
        info: Anything else, kept in the trajectory record.
    """

    observation: tuple[Message, ...] | list[Message] = ()
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class TurnSpan:
    """A contiguous span of ``Trajectory.token_ids``.

    Attributes:
        start: First token index (inclusive).
        end: Last token index (exclusive).
        kind: "prompt", "model" (sampled by the policy) or "observation"
            (tool / env messages and the template tokens around them).
        reward: For a model span, the env's reward for that turn.
        role: For a model span, the env's role that took the turn (``Env.role``;
            "" for an env without ``roles``): which adapter sampled it and is trained
            on it under ``trainer.lora.per_role``.
    """

    start: int
    end: int
    kind: str
    reward: float = 0.0
    role: str = ""


@dataclass
class Trajectory:
    """One episode, exactly as the model saw and produced it.

    ``token_ids``, ``loss_mask``, ``rollout_logprobs`` and ``weight_versions``
    have the same length. Only tokens with ``loss_mask == 1`` were sampled by the
    policy; their ``rollout_logprobs`` come from the server that sampled them and
    their ``weight_versions`` name the weights that produced them (-1 elsewhere).

    Attributes:
        task_id: Id of the task (row) the episode ran.
        group_id: Episodes of the same task in one batch share it (GRPO groups).
        episode_id: Unique per episode.
        token_ids: Prompt, then every model turn and observation, in order.
        loss_mask: 1 on the model's own tokens, 0 elsewhere.
        rollout_logprobs: Sampling logprobs on model tokens, 0.0 elsewhere.
        weight_versions: Weight version that produced each model token, -1 elsewhere.
        prompt_length: Number of tokens in the initial prompt.
        spans: The turn structure of ``token_ids``.
        reward: Total reward (sum of per-turn rewards).
        stop_reason: Why the episode ended.
        messages: The conversation, for humans.
        num_turns: Number of model turns.
        metrics: Per-episode numbers (tool errors, timings, …).
        info: Env info of the last step.
        tool_calls: One record per tool message, in order: ``turn`` (0-based model
            turn), ``id``, ``name``, ``latency_s``, ``error`` (the failure's metric
            name, or None) and ``output_chars`` (see ``tools.ToolCallRecord``).
        error: Traceback or message when the episode failed.
        strategy: How the chat template was trained on: "as_sampled" (one sequence,
            exactly as the model saw it) or "per_turn" (each model turn its own sample
            whose prompt is the template's rendering of the conversation so far).
        sample_starts: For "per_turn": where each training sample begins in
            ``token_ids`` (the first at 0); positions restart at each and a sample
            attends only to itself. Empty: the whole sequence is one sample. The
            samples of an episode stay in one Trajectory, so grouping, rewards and
            advantages are per episode and reach every sample's tokens.
    """

    task_id: str
    group_id: str
    episode_id: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    spans: list[TurnSpan] = field(default_factory=list)
    reward: float = 0.0
    stop_reason: StopReason = StopReason.DONE
    messages: list[Message] = field(default_factory=list)
    num_turns: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    strategy: str = "as_sampled"
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    sample_starts: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def samples(self) -> list[tuple[int, int]]:
        """(start, end) of each training sample in ``token_ids`` (one unless "per_turn")."""
        starts = self.sample_starts or [0]
        ends = [*starts[1:], len(self.token_ids)]
        return list(zip(starts, ends, strict=True))

    def position_ids(self) -> list[int]:
        """Position of each token within its sample (restarting at each sample start)."""
        out: list[int] = []
        for start, end in self.samples():
            out.extend(range(end - start))
        return out

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def turn_rewards(self) -> list[tuple[int, float]]:
        """(index of the last token of a model turn, reward of that turn) pairs."""
        return [(s.end - 1, s.reward) for s in self.spans if s.kind == "model" and s.end > s.start]

    def validate(self) -> None:
        """Raises ValueError naming this trajectory when its per-token fields disagree."""
        n = len(self.token_ids)
        lens = {
            "loss_mask": len(self.loss_mask),
            "rollout_logprobs": len(self.rollout_logprobs),
            "weight_versions": len(self.weight_versions),
        }
        bad = {k: v for k, v in lens.items() if v != n}
        if bad:
            raise ValueError(
                f"trajectory {self.episode_id} (task {self.task_id}): token_ids has {n} tokens "
                f"but {', '.join(f'{k} has {v}' for k, v in bad.items())}"
            )
        st = self.sample_starts
        if st and (st[0] != 0 or st != sorted(set(st)) or st[-1] >= n):
            raise ValueError(
                f"trajectory {self.episode_id} (task {self.task_id}): sample_starts {st} must "
                f"start at 0 and increase strictly below {n}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (used by trajectory files and ``agentrl view``)."""
        d = asdict(self)
        d["stop_reason"] = str(self.stop_reason)
        d["messages"] = [m.to_dict() for m in self.messages]
        return d
