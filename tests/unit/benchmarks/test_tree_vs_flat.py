"""benchmarks/tree_vs_flat.py's figures from small fake run directories, worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.reporting.run_dir import RunDir
from agentrl.types import StopReason, Trajectory
from benchmarks import tree_vs_flat
from benchmarks.tree_vs_flat import compare, config_diff, run_figures, table


def _episode(model: int, generated: int | None = None) -> Trajectory:
    """An episode with ``model`` model tokens; a tree leaf that generated ``generated``."""
    return Trajectory(
        task_id="t", group_id="g", episode_id="g/0", token_ids=[1] * (model + 1),
        loss_mask=[0] + [1] * model, rollout_logprobs=[0.0] * (model + 1),
        weight_versions=[-1] + [0] * model, prompt_length=1, reward=0.0,
        stop_reason=StopReason.DONE,
        metrics={} if generated is None else {"tree_generated_tokens": float(generated)},
        info={} if generated is None else {"tree": {"node_ids": ["0"], "leaf": "0"}},
    )  # fmt: skip


def _run(root: Path, name: str, *, tree: bool, seed: int, before: float, after: float,
         step_s: tuple[float, float], total: float) -> Path:  # fmt: skip
    """2 steps of 2 episodes: flat 4 + 6 model tokens; tree leaves of 6 model tokens each
    that generated 6 and 2 (their shared turn counted on the first)."""
    run = RunDir(root / name)
    for step in (1, 2):
        eps = [_episode(6, 6), _episode(6, 2)] if tree else [_episode(4), _episode(6)]
        run.save_trajectories(step, eps)
    gen, upd = step_s
    lines: list[dict[str, Any]] = [{"kind": "eval", "step": 0, "success": before, "episodes": 4}]
    lines += [{"kind": "train", "step": s, "time/generate": gen, "time/update": upd,
               "time/sync": 0} for s in (1, 2)]  # fmt: skip
    lines.append({"kind": "eval", "step": 2, "success": after, "episodes": 4})
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (run.path / "summary.json").write_text(json.dumps({"seconds": {"total": total}}))
    rollout = {"tree": {"width": 2} if tree else None, "tasks_per_step": 1, "group_size": 2}
    cfg = {"seed": seed, "steps": 2, "rollout": rollout,
           "eval": {"num_tasks": 4, "temperature": 1.0}}  # fmt: skip
    (run.path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run.path


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    # (name, tree, seed, before, after, (generate, update) s per step, whole run s)
    spec = [
        ("f0", False, 0, 0.25, 0.5, (10, 20), 100),
        ("t0", True, 0, 0.25, 0.75, (15, 30), 150),
        ("f1", False, 1, 0.25, 0.25, (20, 20), 120),
        ("t1", True, 1, 0.25, 0.5, (15, 30), 150),
    ]
    return [
        _run(tmp_path, n, tree=t, seed=s, before=b, after=a, step_s=st, total=tot)
        for n, t, s, b, a, st, tot in spec
    ]


def test_run_figures_by_hand(runs):
    flat, tree = run_figures(runs[0]), run_figures(runs[1])
    assert (flat["arm"], flat["seed"], tree["arm"]) == ("flat", 0, "tree")
    # Flat: 4 + 6 model tokens per step, all generated; 2 steps x (10 + 20) s.
    assert flat["gen_tokens_per_step"] == 10 and flat["gen_tokens_per_episode"] == 5
    assert flat["prefix_reuse"] == 0 and flat["train_s"] == 60 and flat["whole_s"] == 100
    assert (flat["before"], flat["after"], flat["gain"]) == (0.25, 0.5, 0.25)
    # Tree: leaves hold 6 model tokens but generated 6 + 2 per step: 4 per leaf, 16 of 24.
    assert tree["gen_tokens_per_step"] == 8 and tree["gen_tokens_per_episode"] == 4
    assert tree["model_tokens_per_episode"] == 6
    assert tree["prefix_reuse"] == pytest.approx(1 / 3)
    assert (tree["gain"], tree["train_s"], tree["episodes_per_step"]) == (0.5, 90, 2)


def test_compare_by_hand(runs):
    c = compare([run_figures(d) for d in runs])
    assert c["seeds"] == {"flat": [0, 1], "tree": [0, 1]}
    flat_gain, tree_gain = c["arms"]["flat"]["gain"], c["arms"]["tree"]["gain"]
    assert flat_gain["mean"] == 0.125 and (flat_gain["min"], flat_gain["max"]) == (0, 0.25)
    assert flat_gain["std"] == pytest.approx(0.25 / 2**0.5)  # stdev of (0.25, 0)
    assert tree_gain["mean"] == 0.375 and c["gain_diff"] == 0.25
    # Flat train time: 60 and 80 s (mean 70); tree 90 and 90; whole 110 vs 150.
    assert c["ratios"] == pytest.approx(
        {"gen_tokens_per_episode": 0.8, "gen_tokens_per_step": 0.8,
         "train_s": 90 / 70, "whole_s": 150 / 110}
    )  # fmt: skip
    rows = {r[0]: r[1:] for r in table(c)["rows"]}
    assert rows["held-out gain"] == ["+0.125 [+0.000, +0.250]", "+0.375 [+0.250, +0.500]",
                                     "+0.250 (diff)"]  # fmt: skip
    assert rows["generated tokens / episode (leaf)"][2] == "0.80x"
    # Gains [0, 0.25] and [0.25, 0.5] touch: the difference is within the seeds' spread.
    assert "slower" in tree_vs_flat.verdict(c)
    assert "tree ahead, within the spread" in tree_vs_flat.verdict(c)


def test_compare_needs_both_arms(runs):
    with pytest.raises(SystemExit, match="both arms"):
        compare([run_figures(runs[0])])


def test_from_runs_records_the_table(runs, monkeypatch):
    got: dict[str, Any] = {}
    monkeypatch.setattr(tree_vs_flat, "record", lambda name, entry: got.update({name: entry}))
    assert tree_vs_flat.main(["--from-runs", *map(str, runs)]) == 0
    entry = got["tree_vs_flat"]
    by_name = {r["name"]: r for r in entry["results"]}
    assert by_name["tree_minus_flat_gain"]["value"] == 0.25
    assert by_name["flat_gain"]["range"] == [0, 0.25]
    assert by_name["tree_vs_flat_gen_tokens_per_leaf"]["value"] == pytest.approx(0.8)
    assert len(entry["table"]["rows"]) == len(tree_vs_flat.ROWS) and len(entry["runs"]) == 4


def test_the_presets_differ_only_in_tree_and_estimator(tmp_path, monkeypatch):
    keys = config_diff(["seed=1", "steps=3"])
    assert keys and all(k.startswith(tree_vs_flat.ALLOWED) for k in keys)
    assert "trainer.advantage.estimator" in keys and "rollout.tree.width" in keys
    other = tmp_path / "flat.yaml"
    cfg = yaml.safe_load((tree_vs_flat.ROOT / "configs/retool.yaml").read_text())
    cfg["trainer"]["optim"]["lr"] = 1e-3
    other.write_text(yaml.safe_dump(cfg))
    monkeypatch.setitem(tree_vs_flat.ARMS, "flat", str(other))
    with pytest.raises(SystemExit, match=r"trainer\.optim\.lr"):
        config_diff([])
