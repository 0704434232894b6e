"""benchmarks.vs_trl: figures from each run, the ratios, the table, the process-tree RSS."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from benchmarks import vs_trl
from benchmarks.vs_trl_runs import agentrl_figures, retool_reward


def _raw(**kw: float) -> dict[str, float]:
    raw = {
        "steps": 4.0, "gen_s": 40.0, "update_s": 20.0, "generated_tokens": 4000.0,
        "trainer_tokens": 50000.0, "before": 0.2, "after": 0.8,
    }  # fmt: skip
    return {**raw, **kw}


def test_a_row_splits_each_step_and_divides_the_gain_by_whole_minutes() -> None:
    row = vs_trl.per_run(_raw(), wall_s=300.0, peak_rss=3 * 2**30)
    assert row["gen_s_per_step"] == 10.0
    assert row["update_s_per_step"] == 5.0
    assert row["gen_tok_per_s"] == 100.0
    assert row["trainer_tok_per_s"] == 2500.0
    assert row["peak_rss_gb"] == 3.0
    assert row["gain"] == pytest.approx(0.6)
    assert row["gain_per_min"] == pytest.approx(0.6 / 5)


def test_ratios_are_agentrl_over_trl_and_nan_where_trl_is_zero() -> None:
    ours = {"wall_s": 100.0, "gain_per_min": 0.4, "before": 0.2}
    theirs = {"wall_s": 400.0, "gain_per_min": 0.1, "before": 0.0}
    r = vs_trl.ratios(ours, theirs)
    assert r["wall_s"] == 0.25
    assert r["gain_per_min"] == pytest.approx(4.0)
    assert math.isnan(r["before"])


def test_the_median_over_seeds_is_taken_per_column() -> None:
    rows = [{"a": 1.0, "b": 9.0}, {"a": 3.0, "b": 1.0}, {"a": 2.0, "b": 5.0}]
    assert vs_trl.median_rows(rows) == {"a": 2.0, "b": 5.0}


def test_the_table_has_a_row_per_framework_and_the_ratios() -> None:
    agentrl = vs_trl.per_run(_raw(), 300.0, 2**30)
    trl = vs_trl.per_run(_raw(gen_s=400.0, after=0.5), 1200.0, 4 * 2**30)
    entry = {"trl_mode": "transformers", "rows": {"agentrl": agentrl, "trl": trl},
             "ratios": vs_trl.ratios(agentrl, trl)}  # fmt: skip
    lines = vs_trl.table(entry).splitlines()
    assert len(lines) == 5
    assert lines[2].startswith("| agentrl | 300 |")
    assert lines[3].startswith("| TRL (transformers) | 1200 |")
    assert "| 0.25x |" in lines[4]  # whole-run wall time and peak RSS


def test_agentrl_figures_sum_the_train_steps_only() -> None:
    lines = [
        {"kind": "eval", "time/generate": 99.0},
        {"kind": "train", "time/generate": 3.0, "time/train": 2.0, "batch/model_tokens": 30.0,
         "perf/step_tokens_per_s": 100.0, "time/step": 2.0},
        {"kind": "train", "time/generate": 5.0, "time/train": 4.0, "batch/model_tokens": 50.0,
         "perf/step_tokens_per_s": 50.0, "time/step": 4.0},
    ]  # fmt: skip
    f = agentrl_figures(lines)
    assert f == {"steps": 2.0, "gen_s": 8.0, "update_s": 6.0, "generated_tokens": 80.0,
                 "trainer_tokens": 400.0}  # fmt: skip
    with pytest.raises(ValueError, match="no train metrics"):
        agentrl_figures(lines[:1])


def test_the_trl_reward_scores_the_first_boxed_answer_as_the_env_does() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}
    done = [
        call,
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": r"\boxed{42}"},
    ]
    first_wins = [{"role": "assistant", "content": r"\boxed{7}"},
                  {"role": "assistant", "content": r"\boxed{42}"}]  # fmt: skip
    assert retool_reward([done, first_wins, [call]], ["42", "42", "42"]) == [1.0, 0.0, 0.0]


def test_tree_rss_counts_the_children_too() -> None:
    code = "import subprocess,sys; b = bytearray(100 * 2**20); subprocess.run([sys.executable, '-c', 'import time; b = bytearray(100 * 2**20); time.sleep(30)'])"  # noqa: E501
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        seen = 0
        for _ in range(100):
            seen = max(seen, vs_trl.tree_rss_bytes(proc.pid))
            if seen > 150 * 2**20:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert seen > 150 * 2**20
    finally:
        for kid in _descendants(proc.pid):
            os.kill(kid, 9)
        proc.kill()
        proc.wait()
    assert vs_trl.tree_rss_bytes(proc.pid) == 0


def _descendants(pid: int) -> list[int]:
    kids = vs_trl._children()
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def test_the_sampler_keeps_the_peaks_and_stops() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "b = bytearray(50 * 2**20); input()"],
                            stdin=subprocess.PIPE)  # fmt: skip
    sampler = vs_trl.Sampler(proc.pid, period=0.05)
    sampler.start()
    try:
        for _ in range(100):
            if sampler.peak_rss > 50 * 2**20:
                break
            subprocess.run(["sleep", "0.05"], check=True)
    finally:
        proc.communicate(b"\n", timeout=10)
        sampler.stop()
    assert not sampler.is_alive()
    assert sampler.peak_rss > 50 * 2**20
    assert sampler.peak_machine >= sampler.peak_rss
