"""mini-swe-agent, unchanged, trains on the SWE env's tasks through one agent spec: real
Docker (the agent's container and a fresh grading one), real mini-swe-agent (DefaultAgent,
its mini.yaml prompts, LitellmModel on the gateway) and the shared untrained server.

The untrained model never fixes anything (nor writes a well-formed tool call): the test
claims the plumbing. Without the adapter every episode is an ``agent_error`` (no module,
a litellm cost error, or a command run on the host); without the gateway's episode report
no ``swe_*`` / ``minisweagent_*`` figure reaches the trajectories.
"""

from __future__ import annotations

import importlib

import pytest

from tests.helpers.one_step import train_one_step
from tests.integration import docker_fixtures

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
docker_image = docker_fixtures.docker_image  # the session fixture: agentrl/python, built once

EXITS = {"Submitted", "RepeatedFormatError", "LimitsExceeded"}


def test_minisweagent_trains_one_step_on_swe_tasks(
    docker_image, untrained_model_dir, attached_server_url, tmp_path
):
    importlib.import_module("minisweagent")  # the swe-agents extra, installed by make test
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(tmp_path),
        "run_name": "mini",
        "rollout.tasks_per_step": 1,
        "rollout.group_size": 2,
        "rollout.max_turns": 3,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 3072,  # mini.yaml's first prompt is ~1,600 tokens
        "eval.num_tasks": 1,
        "eval.every": 0,
        "wandb": "disabled",
        "steps": 1,
    }
    run = tmp_path / "mini"
    trajs = train_one_step(
        ["--env", "swe", "--agent", "agentrl.envs.swe.minisweagent:solve"],
        args,
        run,
        episodes=2,
        weight_version=None,
        timeout=500,
    )
    for t in trajs:
        # mini-swe-agent's loop ran to one of its own exits, every model call through the
        # gateway and recorded token for token; nothing raised.
        assert str(t.stop_reason) in ("done", "max_turns", "max_tokens"), (t.stop_reason, t.error)
        assert t.info["minisweagent_exit_status"] in EXITS, t.info
        assert t.metrics["minisweagent_model_calls"] == t.metrics["gateway/api_chat"] >= 1
        assert t.num_model_tokens > 0
        # Its commands are recorded (the untrained model's replies hold none it can run).
        assert len(t.info["minisweagent_command_log"]) == t.metrics["minisweagent_commands"]
        # The repository's diff was graded by the SWE grader in a fresh container.
        assert t.info["swe_task"] and t.info["swe_ended_by"] == (
            "submit"
            if t.info["minisweagent_exit_status"] == "Submitted"
            else t.info["minisweagent_exit_status"]
        )
        assert t.metrics["swe_grade_time_s"] > 0 and "swe_patch_applied" in t.metrics
        assert t.reward == t.metrics["swe_resolved"] == 0.0
    # The prompt the model saw is mini-swe-agent's own, with its bash tool and the issue.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    prompt = tok.decode(trajs[0].token_ids[: trajs[0].prompt_length])
    assert "Please solve this issue: Fix this issue in the repository at /workspace/repo" in prompt
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in prompt and '"bash"' in prompt
