"""benchmarks.lora_vs_full: a run's row from its metrics lines, the table, and record()."""

from __future__ import annotations

import json

import pytest

from benchmarks import lora_vs_full
from benchmarks.report import record


def _lines() -> list[dict]:
    train = [
        {"kind": "train", "step": s, "time/update": u, "time/sync": 0.5, "sync/bytes": 2e7,
         "time/generate": 10.0, "time/train": u + 1, "perf/peak_rss_gb": p,
         "perf/rss_between_steps_gb": b}
        for s, u, p, b in ((1, 40.0, 3.0, 1.0), (2, 60.0, 4.0, 1.5))
    ]  # fmt: skip
    evals = [
        {"kind": "eval", "step": 2, "success": 0.75},
        {"kind": "eval", "step": 0, "success": 0.25},
    ]
    return [*train, *evals]


def test_a_runs_row_by_hand() -> None:
    row = lora_vs_full.run_figures(_lines(), wall_s=300.0)
    # update mean (40 + 60) / 2; step = generate 10 + train (41 + 61) / 2 + sync 0.5
    assert row["update_s"] == 50.0 and row["step_s"] == 61.5 and row["sync_s"] == 0.5
    assert row["sync_mb"] == 20.0  # 2e7 bytes
    assert row["peak_rss_gb"] == 4.0 and row["between_rss_gb"] == 1.5  # the worst step
    assert (row["before"], row["after"], row["gain"]) == (0.25, 0.75, 0.5)  # by eval step


def test_a_run_without_evaluations_is_an_error() -> None:
    with pytest.raises(SystemExit, match="evaluation"):
        lora_vs_full.run_figures([m for m in _lines() if m["kind"] == "train"], 1.0)


def test_table_rows_ratios_and_serving() -> None:
    full = lora_vs_full.run_figures(_lines(), 400.0)
    lora = {**full, "wall_s": 600.0, "sync_mb": 1.0}
    entry = {
        "rows": {"full": full, "lora": lora},
        "ratios": {k: lora[k] / full[k] for k in full},
        "serving": {"base_tok_s": 80.0, "adapter_tok_s": 20.0},
    }
    text = lora_vs_full.table(entry)
    assert "| lora/full | 1.500x |" in text  # 600 / 400
    assert "| 0.050x |" in text  # sync MB 1 / 20
    assert "| adapter/base | 0.25x |" in text


def test_record_keeps_other_entries(tmp_path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"other": {"x": 1}}))
    record("lora_vs_full", {"rows": {}}, results)
    data = json.loads(results.read_text())
    assert data["other"] == {"x": 1}
    assert data["lora_vs_full"]["rows"] == {} and "date" in data["lora_vs_full"]
