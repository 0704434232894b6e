"""A prompt shared by a micro-batch's rows runs once (``trainer.update.share_prefix``)."""

from __future__ import annotations

import pytest
import torch

from agentrl.cli.errors import is_user_error
from agentrl.errors import TrainerSetupError
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer.engine.actor import PolicyModule, run_micro_batch
from agentrl.trainer.engine.batch import Batch, build_batch, make_micro_batch, shared_prefix_len
from agentrl.types import Trajectory
from tests.helpers.trainer import VOCAB, assert_same_update, episode, tiny_lm


def shared_batch(n: int = 8, common: int = 40, group_size: int = 4) -> list[Trajectory]:
    """``n`` episodes: ``common`` prompt tokens shared by all, 3 more per group, then a
    random response of 4..11 tokens (rewards alternate within a group)."""
    g = torch.Generator().manual_seed(7)
    head = torch.randint(0, VOCAB, (common,), generator=g).tolist()
    out = []
    for i in range(n):
        task = torch.randint(0, VOCAB, (3,), generator=torch.Generator().manual_seed(i // 4))
        resp = torch.randint(0, VOCAB, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g)
        t = episode(i, f"g{i // group_size}", head + task.tolist(), resp.tolist(), float(i % 2))
        t.rollout_logprobs = [0.0] * (common + 3) + (
            -4.0 - torch.rand(len(resp), generator=g)
        ).tolist()
        out.append(t)
    return out


def as_batch(trajs: list[Trajectory]) -> Batch:
    return build_batch(trajs, [t.reward for t in trajs], [False] * len(trajs))


def test_prefix_is_the_common_prompt_and_stops_before_the_first_scored_position() -> None:
    # Rows agree on tokens 0..4 and differ at 5: P = 5.
    a = episode(0, "g", [1, 2, 3, 4, 5, 6, 7, 8], [9, 9], 1.0)
    b = episode(1, "g", [1, 2, 3, 4, 5, 0, 7, 8], [9], 0.0)
    assert shared_prefix_len(as_batch([a, b]), [0, 1]) == 5
    # Identical prompts up to the shortest one (first model token at 6): the hidden state
    # at 5 scores it, so the prefix is 0..4 whatever the rows share after.
    c = episode(2, "g", [1, 2, 3, 4, 5, 6], [7, 8, 9], 1.0)
    batch = as_batch([a, c])
    assert shared_prefix_len(batch, [0, 1]) == 5
    assert shared_prefix_len(batch, [0]) == 0  # one row: nothing to share
    d = episode(3, "g", [4, 2, 3], [1], 1.0)
    assert shared_prefix_len(as_batch([a, d]), [0, 1]) == 0


def test_micro_batch_inputs_split_at_the_prefix() -> None:
    batch = as_batch(shared_batch())
    rows = list(range(8))
    plain = make_micro_batch(batch, rows, packing=False)
    mb = make_micro_batch(batch, rows, packing=False, share_prefix=True)
    assert mb.prefix_ids is not None and plain.prefix_ids is None
    P = mb.prefix_ids.shape[1]
    assert P == 40  # shared by all; the two groups' task tokens differ from the first
    L = plain.input_ids.shape[1]
    torch.testing.assert_close(
        torch.cat([mb.prefix_ids.expand(8, P), mb.input_ids], 1), plain.input_ids
    )
    assert mb.attention_mask is not None and mb.attention_mask.shape == (8, L)
    assert torch.equal(mb.position_ids[:, 0], torch.full((8,), P))
    # The same hidden states score the same targets: (row, column) after the prefix.
    rows_s, cols_s = mb.sel_N // (L - P), mb.sel_N % (L - P) + P
    assert torch.equal(rows_s, plain.sel_N // L) and torch.equal(cols_s, plain.sel_N % L)
    assert torch.equal(mb.targets_N, plain.targets_N)
    assert mb.num_tokens == plain.num_tokens


def test_shared_forward_gives_the_same_logprobs_and_gradients() -> None:
    batch = as_batch(shared_batch())
    rows = list(range(8))
    mask = batch.mask_BR[rows]
    outs, grads = [], []
    for share in (False, True):
        mod = PolicyModule(tiny_lm(), value_head=True, chunk=16, temperature=0.7)
        mb = make_micro_batch(batch, rows, packing=False, share_prefix=share)
        fo = run_micro_batch(mod, mb, mask, torch.float32)
        assert fo.values_bR is not None
        ((fo.logp_bR * mask).sum() + (fo.entropy_bR * mask).sum() + fo.values_bR.sum()).backward()
        outs.append(fo)
        grads.append({k: p.grad.clone() for k, p in mod.named_parameters() if p.grad is not None})
    a, b = outs
    torch.testing.assert_close(b.logp_bR, a.logp_bR, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.entropy_bR, a.entropy_bR, atol=1e-5, rtol=1e-5)
    assert b.values_bR is not None and a.values_bR is not None
    torch.testing.assert_close(b.values_bR, a.values_bR, atol=1e-5, rtol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for k, g in grads[0].items():  # the prefix's layers get their gradient through the cache
        torch.testing.assert_close(grads[1][k], g, atol=1e-5, rtol=1e-4)


def test_trainer_step_is_the_same_update_with_fewer_tokens_through_the_model() -> None:
    trajs = shared_batch(16)
    cfg = {"optim": {"lr": 1e-2}, "correction": {"mode": "decoupled"}}
    ref = Trainer(TrainerConfig(**cfg, update={"share_prefix": False}), tiny_lm())
    alt = Trainer(TrainerConfig(**cfg), tiny_lm())  # auto: on for padded rows on CPU
    assert alt.share_prefix and not ref.share_prefix
    seen = {"ref": 0, "alt": 0}
    for name, t in (("ref", ref), ("alt", alt)):
        emb = t.policy.lm.get_input_embeddings()
        emb.register_forward_hook(
            lambda _m, args, _o, name=name: seen.__setitem__(name, seen[name] + args[0].numel())
        )
    m_ref, m_alt = assert_same_update(ref, alt, trajs)
    assert m_alt["actor/entropy"] == pytest.approx(m_ref["actor/entropy"], rel=1e-5)
    assert m_alt["offpolicy/logp_absdiff_mean"] == pytest.approx(
        m_ref["offpolicy/logp_absdiff_mean"], rel=1e-5
    )
    # Per micro-batch of b padded rows, the prefix of P tokens ran once instead of b times:
    # (b - 1) * P fewer positions through the embedding, as the step reports.
    assert m_alt["perf/shared_prefix_tokens"] == seen["ref"] - seen["alt"]
    assert m_alt["perf/shared_prefix_tokens"] >= 15 * 40  # 16 rows share at least 40 tokens
    assert m_ref["perf/shared_prefix_tokens"] == 0


def test_share_prefix_true_where_unsupported_names_the_reason() -> None:
    cfg = TrainerConfig(update={"share_prefix": True, "packing": True})
    with pytest.raises(TrainerSetupError, match=r"share_prefix=true .* packed micro-batches"):
        Trainer(cfg, tiny_lm())
    assert is_user_error(TrainerSetupError("x"))  # `agentrl train` prints it as one line
    ckpt = TrainerConfig(update={"share_prefix": True}, actor={"gradient_checkpointing": True})
    with pytest.raises(TrainerSetupError, match="gradient checkpointing"):
        Trainer(ckpt, tiny_lm())
    auto = Trainer(TrainerConfig(update={"packing": True}), tiny_lm())
    assert not auto.share_prefix  # auto: off where unsupported, no error
    off = Trainer(TrainerConfig(update={"share_prefix": False}), tiny_lm())
    assert not off.share_prefix
