"""benchmarks/results.json as Markdown, and recording a make bench run into it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import report


def _run(status: str = "ok", quick: bool = False) -> dict:
    return {
        "date": "2026-12-03T00:00:00",
        "commit": "abc",
        "machine": {"cpus": 2},
        "quick": quick,
        "benchmarks": [
            {
                "benchmark": "rollout_overhead",
                "status": status,
                "results": [
                    {
                        "name": "overhead",
                        "value": 0.04,
                        "target": 0.1,
                        "unit": "",
                        "better": "lower",
                        "baseline": None,
                    }
                ],
            }
        ],
    }


def test_the_table_shows_each_figure_with_its_target_ratio_and_verdict() -> None:
    data = {
        "rollout_overhead": {
            "date": "2026-12-01",
            "results": [
                {
                    "name": "overhead",
                    "value": 0.05,
                    "target": 0.1,
                    "better": "lower",
                    "range": [0.05, 0.07],
                }
            ],
            "note": "8 envs, 2 cores",
            "machine": {"cpus": 2},
        },
        "make_train": {"total_s": 547.0, "held_out_after": 0.958},
    }
    md = report.markdown(data)
    assert (
        "| rollout_overhead | overhead | 0.05 | 0.05–0.07 | ≤ 0.1 | 0.50 | PASS | 2026-12-01 |"
        in md
    )
    assert "| make_train | total_s | 547 s |" in md
    assert "- **rollout_overhead** (2 CPUs): 8 envs, 2 cores" in md


def test_merge_records_a_full_run_keeps_notes_and_skips_failures(tmp_path: Path) -> None:
    data = {"rollout_overhead": {"note": "kept", "results": []}}
    assert report.merge(_run(), data) == ["rollout_overhead"]
    entry = data["rollout_overhead"]
    assert entry["note"] == "kept" and entry["commit"] == "abc"
    assert entry["results"][0]["value"] == 0.04
    before = json.dumps(data)
    assert report.merge(_run(status="failed"), data) == []
    assert json.dumps(data) == before
    with pytest.raises(ValueError, match="--quick"):
        report.merge(_run(quick=True), data)


def test_the_command_merges_then_prints(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results, run = tmp_path / "results.json", tmp_path / "bench-results.json"
    results.write_text("{}")
    run.write_text(json.dumps(_run()))
    assert report.main(["--results", str(results), "--merge", str(run)]) == 0
    assert "rollout_overhead" in json.loads(results.read_text())
    assert "| rollout_overhead | overhead | 0.04 |" in capsys.readouterr().out
    run.write_text(json.dumps(_run(quick=True)))
    assert report.main(["--results", str(results), "--merge", str(run)]) == 2
