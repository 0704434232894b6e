"""Shared helpers of the trainer tests (tiny random Qwen2 models, synthetic episodes).

Used by tests/unit/trainer/, the orchestration and reporting tests that run a real
Trainer, and tests/integration/test_trainer_dp.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from agentrl.types import StopReason, Trajectory, TurnSpan

if TYPE_CHECKING:
    from agentrl.trainer import Trainer

VOCAB = 128


def tiny_lm(seed: int = 0) -> torch.nn.Module:
    """A 2-layer Qwen2 with vocab 128, hidden 64, 4 heads of 16 dims (fp32, random)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    )
    return Qwen2ForCausalLM(cfg).float().eval()


def tiny_model_dir(path: Path, seed: int = 0) -> Path:
    """Saves ``tiny_lm(seed)`` (plus a stub tokenizer_config.json) under ``path``."""
    tiny_lm(seed).save_pretrained(str(path))
    (path / "tokenizer_config.json").write_text('{"model_max_length": 256}')
    return path


def episode(
    i: int,
    group: str,
    prompt: list[int],
    response: list[int],
    reward: float,
    *,
    rollout_logprob: float = -4.0,
    version: int = 0,
    stop: StopReason = StopReason.DONE,
) -> Trajectory:
    """A single-turn episode: prompt tokens (mask 0) then response tokens (mask 1)."""
    n_p, n_r = len(prompt), len(response)
    return Trajectory(
        task_id=group,
        group_id=group,
        episode_id=f"ep{i}",
        token_ids=prompt + response,
        loss_mask=[0] * n_p + [1] * n_r,
        rollout_logprobs=[0.0] * n_p + [rollout_logprob] * n_r,
        weight_versions=[-1] * n_p + [version] * n_r,
        prompt_length=n_p,
        spans=[TurnSpan(0, n_p, "prompt"), TurnSpan(n_p, n_p + n_r, "model")],
        reward=reward,
        stop_reason=stop,
    )


def random_batch(n: int = 8, seed: int = 1, group_size: int = 4) -> list[Trajectory]:
    """``n`` episodes of random tokens and lengths, rewards alternating 1/0 within groups."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        n_p = int(torch.randint(2, 6, (1,), generator=g))
        n_r = int(torch.randint(1, 9, (1,), generator=g))
        ids = torch.randint(0, VOCAB, (n_p + n_r,), generator=g).tolist()
        t = episode(i, f"g{i // group_size}", ids[:n_p], ids[n_p:], float(i % 2))
        t.rollout_logprobs = [0.0] * n_p + (-4.0 - torch.rand(n_r, generator=g)).tolist()
        out.append(t)
    return out


def params(trainer: Trainer) -> dict[str, torch.Tensor]:
    """A copy of ``trainer``'s policy weights (as inference loads them)."""
    return {k: v.clone() for k, v in trainer.state_dict_for_inference().items()}


def assert_same_update(
    ref: Trainer, alt: Trainer, trajs: list[Trajectory]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Steps ``ref`` and ``alt`` (same initial weights) on ``trajs`` and checks they agree.

    The update must be real (some weight moves > 1e-3) and the same in both: grad
    norms within 1e-5 relative, weights within 1e-4. Returns both steps' metrics.
    """
    p0 = params(ref)
    m_ref, m_alt = ref.step(trajs), alt.step(trajs)
    assert m_alt["actor/grad_norm"] == pytest.approx(m_ref["actor/grad_norm"], rel=1e-5)
    a, b = params(ref), params(alt)
    assert max(float((a[k] - p0[k]).abs().max()) for k in a) > 1e-3  # the update is real
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-4, rtol=0)
    return m_ref, m_alt
