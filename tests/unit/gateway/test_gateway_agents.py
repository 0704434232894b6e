"""Bring-your-own agents: the solve/score contract, failures that end one episode with a
reason, the retool example agent, and the `agentrl train --agent/--tasks` wiring."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from agentrl.config import load_config
from agentrl.gateway import AgentRunner, AgentSpecError, Gateway, GatewayLimits, load_agent
from agentrl.inference.protocol import LLMError
from agentrl.orchestration.driver import select_groups
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy
from agentrl.types import StopReason
from tests.helpers.gateway import Recording
from tests.helpers.paths import REPO

RETOOL_AGENT = REPO / "examples" / "byo_agent" / "retool_agent.py"


async def run(
    tokenizer: Any, solve: Any, *, score: Any = None, reply: Any = None, task: Any = None, **kw: Any
):
    llm = Recording(TextPolicy(tokenizer, reply or (lambda p: "ok")))
    async with Gateway(llm, tokenizer, GatewayLimits()) as gw:
        runner = AgentRunner(gw, solve, score=score, **kw)
        traj = await runner.run_episode(task or {"id": "t1", "x": 2}, task_id="t1", episode_id="e")
        assert not gw.sessions  # every episode's session is closed, whatever happened
    return traj, llm


async def ask(client: openai.AsyncOpenAI, text: str = "hi") -> str:
    r = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}]
    )
    return r.choices[0].message.content or ""


async def test_solve_returns_the_reward(tokenizer):
    async def solve(task, client):
        assert task["x"] == 2
        return 0.75 if await ask(client) == "ok" else 0.0

    traj, _ = await run(tokenizer, solve)
    assert traj.reward == 0.75 and traj.stop_reason == StopReason.DONE
    assert traj.num_model_tokens > 0 and traj.turn_rewards[-1][1] == 0.75


async def test_none_is_scored_from_the_last_conversation(tokenizer):
    seen = {}

    async def solve(task, client):
        await ask(client, "question")
        return None

    def score(task, messages):
        seen["messages"] = messages
        return 1.0 if messages[-1]["content"] == "ok" else 0.0

    traj, _ = await run(tokenizer, solve, score=score)
    assert traj.reward == 1.0
    assert seen["messages"] == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "ok"},
    ]


async def test_none_without_a_scorer_is_an_agent_error(tokenizer):
    async def solve(task, client):
        await ask(client)

    traj, _ = await run(tokenizer, solve)
    assert traj.stop_reason == StopReason.AGENT_ERROR and "no scorer" in traj.error


async def test_an_agent_that_raises_ends_with_agent_error_and_its_traceback(tokenizer):
    async def solve(task, client):
        await ask(client)
        raise KeyError("my agent's bug")

    traj, _ = await run(tokenizer, solve)
    assert traj.stop_reason == StopReason.AGENT_ERROR
    assert "Traceback" in traj.error and "my agent's bug" in traj.error
    assert traj.num_model_tokens > 0  # what it generated is kept (and counted as discarded)
    kept, why = select_groups([[traj]], dynamic_filter=False)
    assert not kept and why["episode:agent_error"] == 1


async def test_a_bad_request_the_agent_does_not_catch_is_an_agent_error(tokenizer):
    async def solve(task, client):
        await client.chat.completions.create(model="m", messages=[], n=1)

    traj, _ = await run(tokenizer, solve)
    assert traj.stop_reason == StopReason.AGENT_ERROR and "BadRequestError" in traj.error
    assert "messages" in traj.info["last_api_error"]


async def test_an_agent_that_hangs_is_cut_by_the_episode_timeout(tokenizer):
    async def solve(task, client):
        await ask(client)
        await asyncio.sleep(60)

    traj, _ = await asyncio.wait_for(run(tokenizer, solve, episode_timeout_s=0.5), timeout=10)
    assert traj.stop_reason == StopReason.TIMEOUT and traj.num_model_tokens > 0


async def test_inference_failure_is_reported_as_llm_error(tokenizer):
    llm = Recording(TextPolicy(tokenizer, lambda p: "ok"))
    llm.fail = LLMError("no server")

    async def solve(task, client):
        return float(await ask(client) == "ok")

    async with Gateway(llm, tokenizer) as gw:
        traj = await AgentRunner(gw, solve).run_episode({"id": "t"})
    assert traj.stop_reason == StopReason.LLM_ERROR and "no server" in traj.error


async def test_groups_have_g_episodes_that_the_trainer_batch_accepts(tokenizer):
    from agentrl.trainer.engine.batch import build_batch

    async def solve(task, client):
        msgs = [{"role": "user", "content": f"task {task['id']}"}]
        r = await client.chat.completions.create(model="m", messages=msgs)
        await client.chat.completions.create(  # a rewritten history: a second sample
            model="m", messages=[{"role": "user", "content": "summary"}]
        )
        return float(r.choices[0].message.content == "ok")

    async with Gateway(ScriptedLLM(TextPolicy(tokenizer, lambda p: "ok")), tokenizer) as gw:
        group = await AgentRunner(gw, solve, group_size=3).run_group({"id": 7}, index=0, tag="b")
    assert len(group) == 3 and len({t.group_id for t in group}) == 1
    assert len({t.episode_id for t in group}) == 3
    assert all(len(t.sample_starts) == 2 for t in group)
    batch = build_batch(group, [t.reward for t in group], [False] * 3)
    assert batch.size == 3 and float(batch.mask_BR.sum()) == sum(t.num_model_tokens for t in group)


def test_load_agent_names_what_is_wrong(tmp_path):
    with pytest.raises(AgentSpecError, match=r"expected 'path/to/file\.py:solve'"):
        load_agent("nocolon")
    with pytest.raises(AgentSpecError, match="does not exist"):
        load_agent(str(tmp_path / "missing.py") + ":solve")
    sync = tmp_path / "sync_agent.py"
    sync.write_text("def solve(task, client):\n    return 1.0\n")
    with pytest.raises(AgentSpecError, match="no callable 'run'"):
        load_agent(f"{sync}:run")
    solve, score = load_agent(f"{RETOOL_AGENT}:solve")
    assert asyncio.iscoroutinefunction(solve) and score is not None and score.__name__ == "score"


async def test_retool_example_agent_solves_with_its_python_tool(tokenizer):
    """The example's plain openai loop: a python call, its real output fed back, an answer."""
    from agentrl.envs.retool.data import generate_tasks

    task = generate_tasks(1, seed=0, level="tiny")[0]
    solve, score = load_agent(f"{RETOOL_AGENT}:solve")

    def reply(prompt: str) -> str:
        last = prompt.rsplit("<|im_start|>user", 1)[-1]
        if "<tool_response>" in last:
            out = last.split("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
            return f"The answer is \\boxed{{{out.strip()}}}"
        code = json.dumps({"name": "python", "arguments": {"code": task["solution"]}})
        return f"<tool_call>{code}</tool_call>"

    traj, llm = await run(tokenizer, solve, score=score, reply=reply, task=task)
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0
    assert traj.num_turns == 2 and not traj.sample_starts  # one exact sequence
    # The python tool really ran: its printed sum is what the model was shown.
    assert task["reward_model"]["ground_truth"] in tokenizer.decode(llm.prompts[1])


def test_train_cli_maps_agent_and_tasks_to_the_config(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import agentrl.orchestration.run as run_mod
    from agentrl.cli.app import app

    seen = {}

    def fake_train(config, items, resume, say):
        seen["cfg"] = load_config(config, items)
        raise run_mod.ComponentError("stop here")

    monkeypatch.setattr(run_mod, "train_from_cli", fake_train)
    out = CliRunner().invoke(
        app, ["train", "--agent", f"{RETOOL_AGENT}:solve", "--tasks", "t.jsonl", "steps=1"]
    )
    assert "stop here" in out.output
    cfg = seen["cfg"]
    assert cfg.agent.solve == f"{RETOOL_AGENT}:solve" and cfg.tasks == "t.jsonl" and cfg.steps == 1


def test_agent_runs_take_task_files_as_plain_rows(tmp_path):
    from agentrl.loading.envs import resolve_env
    from agentrl.orchestration.agent_mode import check_agent
    from agentrl.orchestration.startup import ComponentError, load_tasks_for

    rows = [{"id": i, "repo": f"r{i}"} for i in range(20)]  # not retool rows
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"tasks={path}", f"agent.solve={RETOOL_AGENT}:solve"])
    train, held_out = load_tasks_for(cfg, resolve_env(cfg.env))
    assert [dict(r) for r in held_out + train] == rows
    check_agent(cfg)
    with pytest.raises(ComponentError, match=r"unset ray\.address"):
        check_agent(cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": "auto"})}))
    bad = load_config(None, ["agent.solve=nowhere.py:solve"])
    with pytest.raises(ComponentError, match="does not exist"):
        check_agent(bad)
