"""trainer.lora.per_role: one adapter per role, each trained only on its role's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.errors import TrainerSetupError
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.batch import build_batch
from agentrl.trainer.engine.roles import role_index_BR
from agentrl.types import Trajectory, TurnSpan
from tests.helpers.trainer import random_batch, tiny_lm

torch.set_num_threads(2)

ROLES = ["solver", "checker"]


def _cfg(**lora: object) -> TrainerConfig:
    return TrainerConfig(
        optim={"lr": 1e-2}, lora={"rank": 4, "per_role": True, "roles": ROLES, **lora}
    )


def _adapter(t: Trainer, role: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.policy.named_parameters() if f".{role}." in n}


def _two_turns(i: int, roles: tuple[str, str], reward: float) -> Trajectory:
    """prompt(3) | model(2, roles[0]) | observation(2) | model(3, roles[1]), ends with eot."""
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(0, 128, (10,), generator=g).tolist()
    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    return Trajectory(
        task_id="t",
        group_id=f"g{i // 2}",
        episode_id=f"ep{i}",
        token_ids=ids,
        loss_mask=mask,
        rollout_logprobs=[-4.0 * m for m in mask],
        weight_versions=[0 if m else -1 for m in mask],
        prompt_length=3,
        spans=[
            TurnSpan(0, 3, "prompt"),
            TurnSpan(3, 5, "model", role=roles[0]),
            TurnSpan(5, 7, "observation"),
            TurnSpan(7, 10, "model", role=roles[1]),
        ],
        reward=reward,
    )


def _all_role(trajs: list[Trajectory], role: str) -> list[Trajectory]:
    for t in trajs:
        t.spans = [
            TurnSpan(s.start, s.end, s.kind, s.reward, role if s.kind == "model" else "")
            for s in t.spans
        ]
    return trajs


def _randomize_b(t: Trainer, seed: int = 0) -> None:
    """B = 0 at the start makes every adapter the base: give each its own update."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in t.policy.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def test_role_masks_are_the_turns_roles() -> None:
    a = _two_turns(0, ("solver", "checker"), 1.0)
    b = _two_turns(1, ("checker", "checker"), 0.0)
    b.loss_mask[9] = 0  # e.g. an eot the model did not sample: not a model token
    b.rollout_logprobs[9], b.weight_versions[9] = 0.0, -1
    got = role_index_BR([a, b], ROLES, 5)
    # a's model tokens: 3, 4 (solver), 7, 8, 9 (checker); b's: 3, 4, 7, 8 (checker), pad.
    assert got.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, -1]]
    c = _two_turns(2, ("solver", ""), 1.0)
    with pytest.raises(ValueError, match=r"ep2 .*model token 7 has no role"):
        role_index_BR([c], ROLES, 5)


@pytest.mark.parametrize("role", ROLES)
def test_a_step_trains_only_the_adapter_of_the_role_that_sampled(role: str) -> None:
    t = Trainer(_cfg(), tiny_lm())
    other = next(r for r in ROLES if r != role)
    before = {r: _adapter(t, r) for r in ROLES}
    assert before[role] and len(before[role]) == len(before[other])
    m = t.step(_all_role(random_batch(6), role))
    assert m["step"] == 1.0
    mine, theirs = _adapter(t, role), _adapter(t, other)
    assert all(torch.equal(v, before[other][k]) for k, v in theirs.items())
    moved = {k for k, v in mine.items() if not torch.equal(v, before[role][k])}
    assert moved == {k for k in mine if "lora_B" in k}  # B = 0 at the start: A's grad is 0


def test_each_token_is_scored_by_its_own_roles_adapter() -> None:
    t = Trainer(_cfg(), tiny_lm())
    _randomize_b(t)
    trajs = [_two_turns(i, ("solver", "checker"), float(i % 2)) for i in range(4)]
    batch = build_batch(trajs, [tr.reward for tr in trajs], [False] * 4)
    batch.roles_BR = role_index_BR(trajs, ROLES, batch.mask_BR.shape[1])
    mixed = t.prepass(batch, need_old=True)["old_logp"]
    ra, t.role_adapters = t.role_adapters, None  # plain forwards under one adapter each
    assert ra is not None
    alone = {}
    for r in ROLES:
        with ra.using(r):
            alone[r] = t.prepass(batch, need_old=True)["old_logp"]
    assert not torch.allclose(alone["solver"], alone["checker"], atol=1e-3)
    want = torch.where(batch.roles_BR == 0, alone["solver"], alone["checker"])
    torch.testing.assert_close(mixed, want * batch.mask_BR)


def test_gradient_checkpointing_recomputes_under_each_roles_adapter() -> None:
    trajs = [_two_turns(i, ("solver", "checker"), float(i % 2)) for i in range(4)]
    out = []
    for gc in (False, True):
        t = Trainer(
            _cfg().model_copy(
                update={"actor": TrainerConfig().actor.model_copy(
                    update={"gradient_checkpointing": gc}
                )}
            ),
            tiny_lm(),
        )  # fmt: skip
        assert t.gradient_checkpointing is gc
        t.policy.train()  # HF checkpoints only in train mode (tiny_lm comes in eval)
        _randomize_b(t)
        t.step([Trajectory(**vars(tr)) for tr in trajs])
        out.append({r: _adapter(t, r) for r in ROLES})
    for r in ROLES:
        for k, v in out[0][r].items():
            torch.testing.assert_close(out[1][r][k], v, msg=k)


def test_checkpoint_and_inference_hold_every_adapter(tmp_path: Path) -> None:
    t = Trainer(_cfg(), tiny_lm())
    t.step(_all_role(random_batch(6), "checker"))
    states = t.adapter_states_for_inference()
    assert list(states) == ROLES
    assert states["solver"].keys() == states["checker"].keys()
    assert all(".lora_" in k and ".solver." not in k for k in states["solver"])
    k = next(k for k in states["solver"] if "lora_B" in k)
    assert not states["solver"][k].any() and states["checker"][k].any()
    with pytest.raises(ValueError, match="per_role"):
        t.state_dict_for_inference()
    out = t.save_adapter(tmp_path / "adapter")  # peft: one directory per named adapter
    for r in ROLES:
        assert (out / r / "adapter_model.safetensors").is_file(), r
        assert (out / r / "adapter_config.json").is_file(), r
    ckpt = t.save_checkpoint(tmp_path / "ckpt")
    u = Trainer(_cfg(), tiny_lm())
    u.load_checkpoint(ckpt)
    for r in ROLES:
        got, want = _adapter(u, r), _adapter(t, r)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[n], want[n]) for n in want)


def test_final_model_is_the_base_with_every_roles_adapter(tmp_path: Path) -> None:
    """save_hf (a run's final_model/) under per_role: the base's weights, untouched by the
    adapters, and adapters/<role>/ each role's trained adapter."""
    from safetensors.torch import load_file

    t = Trainer(_cfg(), tiny_lm())
    _randomize_b(t)
    base = {k: v.clone() for k, v in tiny_lm().state_dict().items()}  # same seed
    out = t.save_hf(tmp_path / "final")
    saved = load_file(str(out / "model.safetensors"))
    assert not any(".lora_" in k or ".base_layer." in k for k in saved)
    assert all(torch.equal(saved[k], base[k]) for k in saved if k in base)
    assert any(k in base for k in saved)
    for r in ROLES:
        got = load_file(str(out / "adapters" / r / "adapter_model.safetensors"))
        b = next(k for k in got if "lora_B" in k)
        assert got[b].any(), r  # the randomized (trained) adapter, not a fresh one


def test_per_role_needs_two_roles_and_the_adapter_serving() -> None:
    with pytest.raises(TrainerSetupError, match=r"trainer.lora.per_role needs two or more"):
        Trainer(_cfg(roles=["solver"]), tiny_lm())
    with pytest.raises(TrainerSetupError, match=r"trainer.lora.serve=adapter"):
        Trainer(_cfg(serve="merged"), tiny_lm())
    assert Trainer(TrainerConfig(lora={"rank": 2}), tiny_lm()).role_adapters is None
