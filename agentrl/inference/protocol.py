"""The LLM client contract: token ids in, token ids and logprobs out.

The AgentLoop only knows this Protocol. ``agentrl.inference`` implements it over
HTTP (vLLM's ``/v1/completions`` with token-id prompts); tests implement it with
the scripted server (``agentrl.testing.scripted_server``) or an in-process double.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["Generation", "LLMClient", "LLMError", "SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one request.

    Attributes:
        max_tokens: Most tokens to generate.
        temperature: Softmax temperature (0 = greedy).
        top_p: Nucleus sampling mass.
        top_k: Top-k cut (-1 = off).
        stop_token_ids: Extra token ids that end generation (the server's EOS always does).
        seed: Per-request seed (None = server's RNG).
    """

    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One completion.

    Attributes:
        token_ids: Sampled token ids, the stop token included when generation stopped on it.
        logprobs: Sampling logprob of each token in ``token_ids``.
        finish_reason: "stop" (stop token), "length" (max_tokens) or "abort".
        weight_versions: Weight version that produced each token (a weight sync
            during a kept request makes it change mid-sequence).
        server: Which server answered (for routing metrics).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_versions: list[int] = field(default_factory=list)
    server: str | None = None


class LLMError(RuntimeError):
    """The inference side failed for good for this request (after safe retries)."""


@runtime_checkable
class LLMClient(Protocol):
    """Anything that turns a token-id prompt into a :class:`Generation`."""

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str | None = None,
    ) -> Generation:
        """Generates a continuation of ``prompt_ids``.

        Args:
            prompt_ids: The full token history of the episode so far.
            params: Sampling parameters.
            session_id: Episode id, so a router can keep an episode on one server.
        """
        ...
