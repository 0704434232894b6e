"""Multi-stage turns (agentrl.rollout.stages) over real HTTP against the scripted server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from agentrl import Env, Message, StepResult, StopReason
from agentrl.inference.client import CompletionsClient
from agentrl.inference.protocol import Generation, SamplingParams
from agentrl.loading.envs import resolve_env
from agentrl.rollout import AgentLoop
from agentrl.rollout.agent_loop import LoopConfig
from agentrl.rollout.stages import Stage, plan_stages
from agentrl.testing.scripted_server import ScriptedLLM, ScriptedServer, fake_logprob
from tests.helpers.paths import REPO

EXAMPLE = REPO / "examples" / "two_stage_retool.py"

THINK = Stage(
    name="think", stop=("</think>",), temperature=1.0, max_tokens=40, on_budget="</think>"
)
ANSWER = Stage(name="answer", temperature=0.3, max_tokens=12)


class AskEnv(Env):
    """One question; reward 1 for 'ANSWER 5' in the reply."""

    max_turns = 1

    def reset(self, task, *, seed=None):
        return [Message.user("What is 2+3?")]

    def step(self, action):
        return StepResult(reward=float("ANSWER 5" in action.text), terminated=True)


class ThinkPolicy:
    """Thinks (``<think>`` + ``thought`` + ``</think>`` + ``tail``) until the prompt
    holds a ``</think>`` after the last assistant header, then answers."""

    def __init__(self, tokenizer: Any, thought: str = "two and three", tail: str = "junk") -> None:
        self.tok = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.thought, self.tail = thought, tail

    def __call__(self, prompt_ids: Sequence[int], max_tokens: int, seed: int | None) -> list[int]:
        text = self.tok.decode(list(prompt_ids), skip_special_tokens=False)
        if "</think>" in text.rsplit("assistant", 1)[-1]:
            reply = "ANSWER 5"
        else:
            reply = f"<think>{self.thought}</think>{self.tail}"
        return [*self.tok.encode(reply, add_special_tokens=False), self.eos_id]


def enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


async def run_http(tokenizer, policy, stages, **cfg) -> tuple[Any, list[dict[str, Any]]]:
    config = LoopConfig(stages=tuple(stages), sampling=SamplingParams(temperature=0.7), **cfg)
    with ScriptedServer(policy) as server:
        async with CompletionsClient(server.url) as client:
            traj = await AgentLoop(client, tokenizer, config).run(AskEnv(), {})
    return traj, server.requests


def model_part(traj) -> tuple[list[int], list[int], list[float], list[int]]:
    s = traj.prompt_length
    return (
        traj.token_ids[s:],
        traj.loss_mask[s:],
        traj.rollout_logprobs[s:],
        traj.weight_versions[s:],
    )


async def test_two_stages_record_exact_tokens_all_trainable_and_send_each_stages_sampling(
    tokenizer,
):
    traj, requests = await run_http(tokenizer, ThinkPolicy(tokenizer), [THINK, ANSWER])
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0, traj.error
    traj.validate()
    eos, end = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("</think>")
    think = enc(tokenizer, "<think>two and three</think>")
    answer = [*enc(tokenizer, "ANSWER 5"), eos]
    ids, mask, logps, versions = model_part(traj)
    assert ids == think + answer  # stage 1 stopped on </think>: the tail was never sampled
    assert think[-1] == end
    assert mask == [1] * len(ids)
    # Each stage's logprobs are the ones its own request returned (position-keyed).
    assert logps == [fake_logprob(t, traj.prompt_length + i) for i, t in enumerate(ids)]
    assert versions == [0] * len(ids)
    assert [s.kind for s in traj.spans] == ["prompt", "model"]
    assert traj.metrics["stage_tokens/think"] == len(think)
    assert traj.metrics["stage_tokens/answer"] == len(answer)
    assert traj.messages[-1].content == "<think>two and three</think>ANSWER 5"
    # What each request carried: its own temperature, budget, stops and prompt.
    assert len(requests) == 2
    first, second = requests
    assert (first["temperature"], first["max_tokens"]) == (1.0, 40)
    assert (second["temperature"], second["max_tokens"]) == (0.3, 12)
    assert end in first["stop_token_ids"] and end not in second["stop_token_ids"]
    assert second["prompt"] == first["prompt"] + think
    assert first["prompt"] == traj.token_ids[: traj.prompt_length]


async def test_stage_out_of_budget_gets_the_closing_text_inserted_untrainable(tokenizer):
    rambling = ThinkPolicy(tokenizer, thought="x" * 200)
    think = Stage(name="think", stop=("</think>",), max_tokens=6, on_budget="</think>")
    traj, requests = await run_http(tokenizer, rambling, [think, ANSWER])
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0, traj.error
    ids, mask, logps, versions = model_part(traj)
    sampled = enc(tokenizer, "<think>" + "x" * 200)[:6]
    closing = enc(tokenizer, "</think>")
    answer = [*enc(tokenizer, "ANSWER 5"), tokenizer.eos_token_id]
    assert ids == sampled + closing + answer
    assert mask == [1] * 6 + [0] * len(closing) + [1] * len(answer)
    assert versions == [0] * 6 + [-1] * len(closing) + [0] * len(answer)
    n = traj.prompt_length
    pairs = enumerate(zip(ids, mask, strict=True))
    assert logps == [fake_logprob(t, n + i) if m else 0.0 for i, (t, m) in pairs]
    assert requests[0]["temperature"] == 0.7  # no override: the loop's temperature
    assert requests[1]["prompt"][-len(closing) - 6 :] == sampled + closing


async def test_a_stage_that_ends_the_turn_skips_the_later_stages(tokenizer):
    class Direct(ThinkPolicy):
        def __call__(self, prompt_ids, max_tokens, seed):
            return [*self.tok.encode("ANSWER 5", add_special_tokens=False), self.eos_id]

    traj, requests = await run_http(tokenizer, Direct(tokenizer), [THINK, ANSWER])
    assert traj.reward == 1.0 and len(requests) == 1
    assert "stage_tokens/answer" not in traj.metrics


async def test_the_turn_budget_bounds_all_stages_together(tokenizer):
    # 8 tokens for the whole turn: the think stage stops on </think> within them, the
    # answer stage gets only what is left and is cut: the episode ends on max_tokens.
    traj, requests = await run_http(
        tokenizer, ThinkPolicy(tokenizer, thought="ab"), [THINK, ANSWER], max_tokens_per_turn=8
    )
    think = enc(tokenizer, "<think>ab</think>")
    assert traj.stop_reason == StopReason.MAX_TOKENS
    assert requests[1]["max_tokens"] == 8 - len(think)
    assert len(traj.token_ids) - traj.prompt_length == 8


async def test_each_stage_keeps_the_weight_version_that_sampled_it(tokenizer):
    class Bumping(ScriptedLLM):
        async def generate(self, prompt_ids, params, *, session_id=None) -> Generation:
            gen = await super().generate(prompt_ids, params, session_id=session_id)
            self.weight_version += 1  # a weight sync between the two stages
            return gen

    llm = Bumping(ThinkPolicy(tokenizer), weight_version=3)
    loop = AgentLoop(llm, tokenizer, LoopConfig(stages=(THINK, ANSWER)))
    traj = await loop.run(AskEnv(), {})
    ids, _, _, versions = model_part(traj)
    n_think = len(enc(tokenizer, "<think>two and three</think>"))
    assert versions == [3] * n_think + [4] * (len(ids) - n_think)


async def test_env_stages_win_over_the_config(tokenizer):
    class StagedEnv(AskEnv):
        stages = (Stage(name="only", temperature=0.1, max_tokens=30),)

    llm = ScriptedLLM(ThinkPolicy(tokenizer))
    traj = await AgentLoop(llm, tokenizer, LoopConfig(stages=(THINK, ANSWER))).run(StagedEnv(), {})
    assert set(k for k in traj.metrics if k.startswith("stage_tokens/")) == {"stage_tokens/only"}


def test_a_stop_that_is_not_one_token_is_refused_at_construction(tokenizer):
    bad = Stage(name="think", stop=("END OF THOUGHT",))
    with pytest.raises(ValueError, match=r"stage 'think': stop 'END OF THOUGHT' is \d+ tokens"):
        AgentLoop(ScriptedLLM(ThinkPolicy(tokenizer)), tokenizer, LoopConfig(stages=(bad,)))
    assert plan_stages([THINK], tokenizer).stop_ids == (
        (tokenizer.convert_tokens_to_ids("</think>"),),
    )


def test_bad_stage_values_are_refused():
    with pytest.raises(ValueError, match="max_tokens must be ≥ 1"):
        Stage(max_tokens=0)
    with pytest.raises(ValueError, match="temperature must be ≥ 0"):
        Stage(temperature=-1.0)


async def test_two_stage_retool_example_thinks_then_answers(tokenizer):
    env_cls = resolve_env(f"{EXAMPLE}:TwoStageRetool")
    task = {"id": "t", "prompt": "What is 2+3?", "answer": "5"}

    class Boxed(ThinkPolicy):
        def __call__(self, prompt_ids, max_tokens, seed):
            text = self.tok.decode(list(prompt_ids), skip_special_tokens=False)
            done = "</think>" in text.rsplit("assistant", 1)[-1]
            reply = "\\boxed{5}" if done else "<think>2+3 is 5</think>"
            return [*self.tok.encode(reply, add_special_tokens=False), self.eos_id]

    with ScriptedServer(Boxed(tokenizer)) as server:
        async with CompletionsClient(server.url) as client:
            traj = await AgentLoop(client, tokenizer).run(env_cls(), task)
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0, traj.error
    assert [(r["temperature"], r["max_tokens"]) for r in server.requests] == [(1.0, 192), (0.3, 64)]
    assert set(traj.loss_mask[traj.prompt_length :]) == {1}
    assert "Think inside <think></think>" in traj.messages[0].content


def test_config_stages_reach_the_loop_config():
    from agentrl.config import load_config
    from agentrl.orchestration.startup import loop_config

    cfg = load_config(REPO / "configs" / "two-stage-retool.yaml", [])
    stages = loop_config(cfg).stages
    assert stages == (
        Stage(
            name="think", stop=("</think>",), temperature=1.0, max_tokens=192, on_budget="</think>"
        ),
        Stage(name="answer", temperature=0.3, max_tokens=64),
    )
