"""The actor's chunked logprob path and packing against naive references (tiny Qwen2)."""

from __future__ import annotations

import torch

from agentrl.trainer.engine.actor import PolicyModule, chunked_logprobs, run_micro_batch
from agentrl.trainer.engine.batch import build_batch, make_micro_batch
from tests.helpers.trainer import random_batch, tiny_lm

torch.set_num_threads(2)


def _head_states_targets() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    """An lm head (vocabulary 50), 11 hidden states that want gradients, their targets."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    return head, torch.randn(11, 16, requires_grad=True), torch.randint(0, 50, (11,))


def test_chunked_logprobs_match_full_log_softmax_with_grads() -> None:
    head, h, tgt = _head_states_targets()
    # Chunks of 3 (4 chunks, the last one partial), temperature 0.7.
    lp, ent = chunked_logprobs(h, head, tgt, chunk=3, temperature=0.7)
    (lp.sum() + 0.1 * ent.sum()).backward()
    g_h, g_w = h.grad.clone(), head.weight.grad.clone()  # type: ignore[union-attr]
    h.grad = None
    head.weight.grad = None
    logits = head(h) / 0.7
    full = logits.log_softmax(-1)
    ref_lp = full.gather(-1, tgt[:, None]).squeeze(-1)
    ref_ent = -(full.exp() * full).sum(-1)
    (ref_lp.sum() + 0.1 * ref_ent.sum()).backward()
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(g_h, h.grad)
    torch.testing.assert_close(g_w, head.weight.grad)


def test_packed_and_padded_forward_agree_with_plain_hf() -> None:
    lm = tiny_lm()
    trajs = random_batch(4)
    b = build_batch(trajs, [t.reward for t in trajs], [False] * 4)
    mod = PolicyModule(lm, value_head=False, chunk=4, temperature=1.0)
    rows = [0, 1, 2, 3]
    mask = b.mask_BR[rows]
    with torch.no_grad():
        packed = run_micro_batch(mod, make_micro_batch(b, rows, True), mask, torch.float32)
        padded = run_micro_batch(mod, make_micro_batch(b, rows, False), mask, torch.float32)
        # Reference: each episode alone through the HF model, log_softmax over the vocab.
        for i, r in enumerate(rows):
            ids = b.ids[r][None]
            logp = lm(input_ids=ids).logits[0, :-1].log_softmax(-1)
            pos = b.pos_BR[r, : int(b.mask_BR[r].sum())]
            ref = logp[pos - 1, ids[0, pos]]
            torch.testing.assert_close(packed.logp_bR[i, : len(pos)], ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.logp_bR, padded.logp_bR, atol=1e-5, rtol=1e-5)
    assert torch.all(packed.logp_bR[mask == 0] == 0)


def test_entropy_as_a_metric_is_detached_and_spares_no_logprob_gradient() -> None:
    head, h, tgt = _head_states_targets()
    lp, ent = chunked_logprobs(h, head, tgt, chunk=3, temperature=0.7)
    lp.sum().backward()
    g_h = h.grad.clone()  # type: ignore[union-attr]
    h.grad = None
    lp2, ent2 = chunked_logprobs(h, head, tgt, chunk=3, temperature=0.7, entropy_grad=False)
    assert ent.requires_grad and not ent2.requires_grad and lp2.requires_grad
    lp2.sum().backward()
    torch.testing.assert_close(lp2, lp)
    torch.testing.assert_close(ent2, ent.detach())
    torch.testing.assert_close(h.grad, g_h)


def test_the_policy_keeps_entropy_gradients_only_when_the_loss_has_an_entropy_bonus() -> None:
    from agentrl.trainer import Trainer, TrainerConfig

    for coef, grad in ((0.0, False), (0.01, True)):
        t = Trainer(TrainerConfig(loss={"entropy_coef": coef}), tiny_lm(), max_seq_len=64)
        b = build_batch(random_batch(2), [0.0, 1.0], [False] * 2)
        fo = run_micro_batch(t.policy, make_micro_batch(b, [0, 1], False), b.mask_BR, torch.float32)
        assert fo.logp_bR.requires_grad and fo.entropy_bR.requires_grad is grad
