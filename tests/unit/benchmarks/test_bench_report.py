"""benchmarks/report.py's BENCH-RESULT lines and run_all's summary table and JSON."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import run_all
from benchmarks.report import PREFIX, Better, Result, Verdict, parse_line, report
from tests.helpers.paths import REPO


def test_line_round_trips() -> None:
    buf = io.StringIO()
    r = report(
        "http_turns_per_core", 838.5, target=2000, unit="turns/s/core", baseline=6723, file=buf
    )
    line = buf.getvalue()
    assert line.startswith(PREFIX) and line.endswith("\n") and line.count("\n") == 1
    back = parse_line(line)
    assert back == r
    assert back == Result("http_turns_per_core", 838.5, 2000.0, "turns/s/core", Better.HIGHER, 6723)
    assert json.loads(line[len(PREFIX) :])["better"] == "higher"


def test_no_target_round_trips_as_none() -> None:
    buf = io.StringIO()
    report("exec_p50_ms", 2.7, unit="ms", better="lower", file=buf)
    back = parse_line(buf.getvalue())
    assert back is not None
    assert back.target is None and back.baseline is None and back.better is Better.LOWER
    assert back.ratio is None and back.verdict is Verdict.NONE


def test_other_lines_are_not_results_and_malformed_ones_are_errors() -> None:
    assert parse_line("round 0 direct 189.0 tok/s") is None
    assert parse_line("  BENCH-RESULT {}") is None  # only at the start of a line
    with pytest.raises(ValueError, match="malformed BENCH-RESULT"):
        parse_line(PREFIX + "{not json")
    with pytest.raises(ValueError, match="malformed BENCH-RESULT"):
        parse_line(PREFIX + '{"name": "x"}')  # no value
    with pytest.raises(ValueError, match="without spaces"):
        report("two words", 1.0, file=io.StringIO())
    with pytest.raises(ValueError):
        report("x", 1.0, better="sideways", file=io.StringIO())


@pytest.mark.parametrize(
    ("value", "target", "better", "verdict", "ratio"),
    [
        (2500.0, 2000.0, "higher", Verdict.PASS, 1.25),
        (2000.0, 2000.0, "higher", Verdict.PASS, 1.0),  # meeting the target passes
        (838.0, 2000.0, "higher", Verdict.SHORT, 0.419),
        (1.0, 1.5, "lower", Verdict.PASS, 0.6667),
        (1.5, 1.5, "lower", Verdict.PASS, 1.0),
        (71.0, 50.0, "lower", Verdict.SHORT, 1.42),
        (float("nan"), 1.0, "higher", Verdict.SHORT, None),  # NaN never passes
    ],
)
def test_pass_short(value: float, target: float, better: str, verdict: Verdict, ratio) -> None:
    r = Result("f", value, target, better=Better(better))
    assert r.verdict is verdict
    if ratio is None:
        assert r.ratio is not None and math.isnan(r.ratio)
    else:
        assert r.ratio == pytest.approx(ratio, abs=1e-3)


FAKE_OK = """
from benchmarks.report import report
import sys
print("some human output: 1234 turns/s")
report("fast", 2500.0, target=2000, unit="turns/s")
report("slow_p50", 71.0, target=50, unit="ms", better="lower")
report("untargeted", 3.5, unit="x")
report("unmeasured", float("nan"), target=1.0)
print("args", sys.argv[1:])
"""
FAKE_CRASH = """
from benchmarks.report import report
report("before_crash", 1.0, target=2.0)
raise RuntimeError("boom")
"""
FAKE_SILENT = 'print("nothing to report")\n'
FAKE_MALFORMED = 'print("BENCH-RESULT {oops")\n'


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "fakebench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, src in (
        ("ok", FAKE_OK),
        ("crash", FAKE_CRASH),
        ("silent", FAKE_SILENT),
        ("malformed", FAKE_MALFORMED),
    ):
        (pkg / f"{name}.py").write_text(textwrap.dedent(src))
    # The subprocesses import both the fakes and the real benchmarks package.
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    return tmp_path


def test_run_one_streams_output_and_collects_results(fakes: Path) -> None:
    out = io.StringIO()
    o = run_all.run_one("fakebench.ok", ["--n", "3"], out=out)
    assert o.returncode == 0 and not o.failed and not o.errors
    assert [r.name for r in o.results] == ["fast", "slow_p50", "untargeted", "unmeasured"]
    text = out.getvalue()
    assert "some human output: 1234 turns/s" in text and "args ['--n', '3']" in text
    assert text.count(PREFIX) == 4  # the machine lines stream through too


def test_summary_table_and_json_from_real_subprocesses(
    fakes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = fakes / "out" / "bench.json"
    only = "fakebench.ok,fakebench.crash,fakebench.silent,fakebench.malformed"
    rc = run_all.main(["--only", only, "--json", str(path)])
    assert rc == 1  # a crash makes the run fail
    out = capsys.readouterr().out
    summary = out.split("=== summary")[1]
    lines = [line.split() for line in summary.splitlines() if line.startswith("fakebench.")]
    assert lines[:-1] == [
        ["fakebench.ok", "fast", "2,500", "turns/s", "≥", "2,000", "turns/s", "1.25", "PASS"],
        ["fakebench.ok", "slow_p50", "71", "ms", "≤", "50", "ms", "1.42", "SHORT"],
        ["fakebench.ok", "untargeted", "3.5", "x", "—", "—", "—"],
        ["fakebench.ok", "unmeasured", "nan", "≥", "1", "nan", "SHORT"],
        ["fakebench.crash", "before_crash", "1", "≥", "2", "0.50", "SHORT"],
        ["fakebench.crash", "(exit", "1)", "—", "—", "—", "FAILED"],
        ["fakebench.silent", "(no", "figures", "reported)", "—", "—", "—", "—"],
    ]
    assert lines[-1][:2] == ["fakebench.malformed", "(malformed"] and lines[-1][-1] == "FAILED"
    assert "RuntimeError: boom" in out  # the crash's traceback is streamed, not swallowed
    assert "failed: fakebench.crash, fakebench.malformed" in out

    data = json.loads(path.read_text(), parse_constant=pytest.fail)  # strict JSON: no NaN
    assert {"date", "commit", "machine", "benchmarks", "quick"} <= data.keys()
    assert data["machine"]["cpus"] >= 1 and data["quick"] is False
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    assert data["commit"].startswith(sha)
    by = {b["module"]: b for b in data["benchmarks"]}
    assert [b["status"] for b in data["benchmarks"]] == ["ok", "FAILED", "ok", "FAILED"]
    assert by["fakebench.crash"]["returncode"] == 1
    fast, slow, untargeted, unmeasured = by["fakebench.ok"]["results"]
    assert fast == {
        "name": "fast", "value": 2500.0, "target": 2000.0, "unit": "turns/s",
        "better": "higher", "baseline": None, "ratio": 1.25, "verdict": "PASS",
    }  # fmt: skip
    assert (slow["verdict"], untargeted["verdict"], untargeted["ratio"]) == ("SHORT", "—", None)
    assert unmeasured["value"] is None and unmeasured["ratio"] is None
    assert unmeasured["verdict"] == "SHORT"


def test_all_passing_exits_zero(fakes: Path, tmp_path: Path) -> None:
    assert run_all.main(["--only", "fakebench.ok", "--json", str(tmp_path / "r.json")]) == 0


def test_quick_passes_smaller_sizes(
    fakes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(run_all.QUICK_ARGS, "fakebench.ok", ["--tiny"])
    run_all.main(["--only", "fakebench.ok", "--quick", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert "args ['--tiny']" in out and "(--quick sizes)" in out
    assert json.loads((tmp_path / "r.json").read_text())["quick"] is True


def test_a_full_run_passes_the_full_arguments(
    fakes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(run_all.FULL_ARGS, "fakebench.ok", ["--tiny"])
    run_all.main(["--only", "fakebench.ok", "--json", str(tmp_path / "r.json")])
    assert "args ['--tiny']" in capsys.readouterr().out
    for module, args in run_all.FULL_ARGS.items():  # flags the benchmarks really accept
        if module in run_all.BENCHMARKS:
            src = (REPO / (module.replace(".", "/") + ".py")).read_text()
            assert all(f'"{flag}"' in src for flag in args if flag.startswith("--")), module


def test_only_resolves_short_names_and_rejects_unknown() -> None:
    assert run_all.resolve("parsers, templates") == ["benchmarks.parsers", "benchmarks.templates"]
    with pytest.raises(SystemExit, match="unknown benchmark 'nope'"):
        run_all.resolve("nope")


def test_every_listed_benchmark_reports_and_has_quick_sizes() -> None:
    for module in run_all.BENCHMARKS:
        src = (REPO / (module.replace(".", "/") + ".py")).read_text()
        assert "report(" in src, module
        assert module in run_all.QUICK_ARGS, module
        # each quick flag is one the benchmark's argparse accepts
        for flag in run_all.QUICK_ARGS[module][::2]:
            assert f'"{flag}"' in src, (module, flag)


def test_run_all_cli_rejects_unknown_name_with_one_message() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.run_all", "--only", "nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1 and "unknown benchmark 'nope'" in p.stderr
    assert "Traceback" not in p.stderr
