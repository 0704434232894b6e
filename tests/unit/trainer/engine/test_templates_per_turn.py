"""per_turn episodes in the trainer: each sample is scored as if alone, and the episode's
reward, group and advantage reach the model tokens of every sample."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.algo.advantages import AdvantageInputs, compute_advantages
from agentrl.trainer.engine.actor import PolicyModule, run_micro_batch
from agentrl.trainer.engine.batch import build_batch, make_micro_batch
from agentrl.types import Trajectory, TurnSpan
from tests.helpers.trainer import VOCAB, episode, tiny_lm


def per_turn_episode(seed: int, reward: float, group: str = "g") -> Trajectory:
    """Two samples: [prompt 1, turn 1] and [prompt 2 (history re-rendered), turn 2]."""
    g = torch.Generator().manual_seed(seed)
    p1, r1, p2, r2 = (torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 3, 9, 4))
    ids = p1 + r1 + p2 + r2
    s2 = len(p1) + len(r1)
    mask = [0] * 5 + [1] * 3 + [0] * 9 + [1] * 4
    return Trajectory(
        task_id=group,
        group_id=group,
        episode_id=f"pt{seed}",
        token_ids=ids,
        loss_mask=mask,
        rollout_logprobs=[-1.0 if m else 0.0 for m in mask],
        weight_versions=[0 if m else -1 for m in mask],
        prompt_length=5,
        spans=[
            TurnSpan(0, 5, "prompt"),
            TurnSpan(5, 8, "model"),
            TurnSpan(8, 17, "prompt"),
            TurnSpan(17, 21, "model"),
        ],
        reward=reward,
        strategy="per_turn",
        sample_starts=[0, s2],
    )


@pytest.mark.parametrize("packing", [True, False])
def test_each_sample_is_scored_as_if_it_were_alone(packing: bool) -> None:
    lm = tiny_lm()
    pt = per_turn_episode(1, 1.0)
    plain = episode(9, "g", list(range(3, 10)), list(range(20, 26)), 0.0)
    b = build_batch([pt, plain], [1.0, 0.0], [False, False])
    assert b.positions is not None
    assert b.positions[0].tolist() == [*range(8), *range(13)]
    mb = make_micro_batch(b, [0, 1], packing)
    if not packing:
        assert mb.attention_mask is None  # HF masks samples apart from restarting positions
    mod = PolicyModule(lm, value_head=False, chunk=4, temperature=1.0)
    with torch.no_grad():
        out = run_micro_batch(mod, mb, b.mask_BR[[0, 1]], torch.float32)
        refs = []
        for t in (pt, plain):
            for start, end in t.samples():
                ids = torch.tensor(t.token_ids[start:end])[None]
                logp = lm(input_ids=ids).logits[0, :-1].log_softmax(-1)
                pos = [i - start for i in range(start, end) if t.loss_mask[i]]
                refs.append(logp[torch.tensor(pos) - 1, ids[0, pos]])
    torch.testing.assert_close(out.logp_bR[0, :7], torch.cat(refs[:2]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logp_bR[1, :6], refs[2], atol=1e-5, rtol=1e-5)


def test_a_batch_without_per_turn_episodes_is_unchanged() -> None:
    plain = episode(0, "g", [1, 2, 3], [4, 5], 1.0)
    b = build_batch([plain], [1.0], [False])
    assert b.positions is None
    mb = make_micro_batch(b, [0], False)
    assert mb.attention_mask is not None and mb.position_ids.tolist() == [[0, 1, 2, 3, 4]]


def test_episode_reward_group_and_advantage_reach_every_sample() -> None:
    # A GRPO group of two episodes: one per_turn (two samples, reward 1), one plain (reward 0).
    pt = per_turn_episode(2, 1.0)
    plain = episode(1, "g", [1, 2, 3], [4, 5, 6], 0.0)
    b = build_batch([pt, plain], [1.0, 0.0], [False, False])
    assert b.size == 2 and b.group_B.tolist() == [0, 0]  # the group counts episodes
    assert b.turn_BR[0, :7].tolist() == [0, 0, 0, 1, 1, 1, 1]
    adv, ret = compute_advantages(
        "grpo", AdvantageInputs(b.rewards_BR, b.mask_BR, b.turn_BR, b.group_B)
    )
    # (1 - 0.5) / std([1, 0]) on every model token of both samples of the per_turn episode.
    expected = 0.5 / torch.tensor([1.0, 0.0]).std()
    torch.testing.assert_close(adv[0, :7], expected.expand(7), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(adv[1, :3], (-expected).expand(3), atol=1e-4, rtol=1e-4)
    assert torch.all(ret[0, :7] == 1.0)


def test_bad_sample_starts_are_named() -> None:
    t = per_turn_episode(3, 0.0)
    t.sample_starts = [0, 30]
    with pytest.raises(ValueError, match="sample_starts"):
        t.validate()
    t.sample_starts = [4, 8]
    with pytest.raises(ValueError, match="start at 0"):
        t.validate()


@pytest.mark.parametrize(
    "update",
    [{"token_budget": 30, "packing": False}, {"strategy": "fixed", "micro_batch_size": 1}],
)
def test_a_trainer_step_on_per_turn_episodes_is_the_same_packed_or_padded(update: dict) -> None:
    from agentrl.trainer import Trainer, TrainerConfig

    trajs = [
        per_turn_episode(4, 1.0),
        episode(1, "g", [1, 2, 3], [4, 5, 6], 0.0),
        per_turn_episode(5, 0.0),
        episode(2, "g", [7, 8], [9, 10, 11, 12], 1.0),
    ]
    ref = Trainer(
        TrainerConfig(optim={"lr": 1e-3}, update={"token_budget": 10_000, "packing": True}),
        tiny_lm(),
    )
    alt = Trainer(TrainerConfig(optim={"lr": 1e-3}, update=update), tiny_lm())
    m_ref, m_alt = ref.step(trajs), alt.step(trajs)
    assert m_ref["actor/grad_norm"] > 0
    assert m_alt["actor/grad_norm"] == pytest.approx(m_ref["actor/grad_norm"], rel=1e-5)
    for (k, a), b in zip(
        ref.policy.state_dict().items(), alt.policy.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0, msg=k)
