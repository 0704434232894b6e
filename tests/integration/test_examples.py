"""Every file under examples/ runs: here, or in the test that names its path."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentrl import StopReason
from agentrl.inference.protocol import SamplingParams
from agentrl.loading.envs import resolve_env
from agentrl.rollout import AgentLoop, LoopConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_every_example_is_run_by_a_test() -> None:
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    examples = sorted(
        p.relative_to(ROOT).as_posix() for p in EXAMPLES.rglob("*.py") if p.name != "__init__.py"
    )
    assert examples, EXAMPLES
    assert [e for e in examples if e not in tests] == []


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_examples_minimal_grpo_py_trains_a_step_and_syncs_the_weights(untrained_model_dir):
    # The untrained tiny model: same architecture and tokenizer, no minutes of SFT.
    cmd = [sys.executable, str(ROOT / "examples/minimal_grpo.py"), "--steps", "1",
           "--tasks-per-step", "2", "--group-size", "4",
           "--model", str(untrained_model_dir)]  # fmt: skip
    out = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=840, env=dict(os.environ)
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("step 1:")]
    stats = dict(kv.split("=") for kv in line.removeprefix("step 1: ").split())
    assert stats["weight_version"] == "1"  # the trained weights reached the server
    assert all(math.isfinite(float(stats[k])) for k in ("loss", "grad_norm", "reward_mean"))


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_examples_two_stage_retool_py_thinks_then_answers(fleet, untrained_model_dir):
    env_cls = resolve_env(f"{ROOT / 'examples/two_stage_retool.py'}:TwoStageRetool")
    think, answer = env_cls.stages
    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    end = tok.convert_tokens_to_ids("</think>")
    cfg = LoopConfig(max_turns=1, sampling=SamplingParams(temperature=1.0, seed=5))
    (task,) = env_cls.default_tasks(split="test", n=1)
    env = env_cls()
    try:
        traj = await AgentLoop(fleet, tok, cfg).run(env, task, episode_id="two-stage")
    finally:
        await env.close()
    assert traj.error is None and traj.stop_reason in (
        StopReason.DONE,
        StopReason.MAX_TURNS,
        StopReason.MAX_TOKENS,
    ), traj.error
    traj.validate()
    n = traj.prompt_length
    ids, mask = traj.token_ids[n:], traj.loss_mask[n:]
    k = ids.index(end)  # the think stage ends at </think>: sampled, or inserted at its budget
    assert k <= think.max_tokens
    if mask[k] == 0:  # inserted: untrained, no logprob of the model's
        assert k == think.max_tokens and traj.weight_versions[n + k] == -1
    reply = [t for t, m in zip(ids[k + 1 :], mask[k + 1 :], strict=True) if m]
    assert 0 < len(reply) <= answer.max_tokens
