"""The generated reliability table of docs/reliability.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import reliability
from benchmarks.reliability import BEGIN, END

RESULTS = {
    "scale_gateway": {
        "date": "2026-12-04T15:00:00+00:00",
        "commit": "abcdef123456",
        "machine": {"cpus": 2},
        "note": "scripted server",
        "results": [
            {
                "name": "sessions_lost",
                "value": 0,
                "target": 0,
                "unit": "sessions",
                "better": "lower",
                "baseline": None,
            },
            {
                "name": "latency_p50_ratio",
                "value": 1.8432,
                "target": None,
                "unit": "x",
                "better": "lower",
                "baseline": 400.0,
            },
        ],
    },
    "scale_episodes": {
        "date": "2026-12-04T15:10:00+00:00",
        "commit": None,
        "results": [
            {
                "name": "rss_slope",
                "value": 2048,
                "target": 1024,
                "unit": "B/episode",
                "better": "lower",
                "baseline": None,
            },
        ],
    },
    "gateway": {"results": [{"name": "not_a_reliability_figure", "value": 1.0}]},
}


def test_each_recorded_figure_is_a_row_and_unrecorded_benchmarks_have_none() -> None:
    rows = reliability.rows(RESULTS)
    assert rows == [
        [reliability.BENCHMARKS["scale_gateway"], "sessions_lost", "0 sessions",
         "≤ 0 sessions", "PASS", "2026-12-04 (abcdef1)"],
        ["", "latency_p50_ratio", "1.84 x", "—", "—", "2026-12-04 (abcdef1)"],
        [reliability.BENCHMARKS["scale_episodes"], "rss_slope", "2,048 B/episode",
         "≤ 1,024 B/episode", "SHORT", "2026-12-04"],
    ]  # fmt: skip
    text = reliability.render(RESULTS)
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "not_a_reliability_figure" not in text
    assert "soak" not in "".join(r[0] for r in rows)
    assert "Not recorded yet: `soak`, `sandbox_ramp`, `ray_node_loss`." in text
    assert "- `scale_gateway` (2 CPUs): scripted server" in text
    assert "No reliability figures" in reliability.render({})


def test_only_the_section_between_the_markers_is_replaced() -> None:
    page = f"# Title\n\nintro\n\n{BEGIN}\nold table\n{END}\n\nafter\n"
    new = reliability.replace_section(page, reliability.render(RESULTS))
    assert new.startswith("# Title\n\nintro\n\n" + BEGIN) and new.endswith(END + "\n\nafter\n")
    assert "old table" not in new and "sessions_lost" in new
    # Idempotent: rendering again changes nothing.
    assert reliability.replace_section(new, reliability.render(RESULTS)) == new
    with pytest.raises(ValueError, match="each marker once"):
        reliability.replace_section("# no markers\n", "x")
    with pytest.raises(ValueError, match="before"):
        reliability.replace_section(f"{END}\n{BEGIN}\n", "x")


def test_main_writes_the_page_and_check_finds_a_stale_one(tmp_path: Path) -> None:
    results, doc = tmp_path / "results.json", tmp_path / "reliability.md"
    results.write_text(json.dumps(RESULTS))
    doc.write_text(f"# R\n\n{BEGIN}\n{END}\n")
    args = ["--results", str(results), "--doc", str(doc)]
    assert reliability.main([*args, "--check"]) == 1
    assert reliability.main(args) == 0
    assert "sessions_lost" in doc.read_text()
    assert reliability.main([*args, "--check"]) == 0


def test_the_docs_page_is_what_results_json_gives() -> None:
    assert reliability.main(["--check"]) == 0, "run: python -m benchmarks.reliability"
