"""``reward.model``: the reward model's server, started and stopped with the run."""

from __future__ import annotations

from typing import Any

from agentrl.config import RunConfig
from agentrl.inference.reward_model import (
    RewardModelConfigError,
    RewardModelServer,
    check_reward_model_dir,
)
from agentrl.inference.server import ServerStartError
from agentrl.orchestration.startup import ComponentError
from agentrl.rewards import RewardMix, Scorer

__all__ = ["OpenRewardModel", "check_reward_model", "open_reward_model"]


def check_reward_model(cfg: RunConfig) -> None:
    """Refuses a bad ``reward`` section before anything starts (one clear message).

    Raises:
        ComponentError: Not a one-label classification model, or a mode without it.
    """
    r = cfg.reward
    if r.model is None:
        if r.url:
            raise ComponentError("reward.url needs reward.model (the directory, for its tokenizer)")
        return
    if cfg.ray.address is not None:
        raise ComponentError("reward.model is not supported with ray.address yet; run without Ray")
    try:
        check_reward_model_dir(r.model)
    except RewardModelConfigError as e:
        raise ComponentError(str(e)) from None


class OpenRewardModel:
    """The running reward model and its scorer; ``close`` stops the server (idempotent)."""

    def __init__(self, server: RewardModelServer, scorer: Scorer) -> None:
        self.server = server
        self.scorer = scorer

    async def close(self) -> None:
        await self.server.close()


async def open_reward_model(
    cfg: RunConfig, policy_tokenizer: Any, log_dir: str | None
) -> OpenRewardModel:
    """Starts (or attaches to) the reward model's server and builds the scorer.

    Raises:
        ComponentError: Bad directory, a tokenizer mismatch for ``input=tokens``, or a
            server that cannot start (with vLLM's reason).
    """
    from transformers import AutoTokenizer

    r = cfg.reward
    assert r.model is not None
    try:
        path, context = check_reward_model_dir(r.model)
    except RewardModelConfigError as e:
        raise ComponentError(str(e)) from None
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if r.input == "tokens" and tokenizer.get_vocab() != policy_tokenizer.get_vocab():
        raise ComponentError(
            f"reward.input=tokens needs the reward model {r.model!r} to share the policy's "
            "tokenizer, and its vocabulary differs; use reward.input=messages"
        )
    if r.url:
        server = RewardModelServer.attach(r.url, timeout_s=r.timeout_s, batch_size=r.batch_size)
    else:
        try:
            server = await RewardModelServer.launch(
                path,
                dtype=r.dtype,
                max_model_len=r.max_model_len,
                startup_timeout_s=r.startup_timeout_s,
                timeout_s=r.timeout_s,
                batch_size=r.batch_size,
                log_dir=log_dir,
                extra_args=r.extra_args,
            )
        except ServerStartError as e:
            raise ComponentError(f"reward model server cannot start: {e}") from e
    mix = RewardMix(weight=r.weight, env_weight=r.env_weight, clip=r.clip)
    scorer = Scorer(
        server.client, tokenizer, mix=mix, input=r.input, max_len=r.max_model_len or context
    )
    return OpenRewardModel(server, scorer)
