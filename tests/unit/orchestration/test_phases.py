"""A run's wall time by phase: the clock, its one-line summary, and the benchmark's reading."""

from __future__ import annotations

import time

import pytest

from agentrl.orchestration.phases import PhaseClock, describe_phases
from benchmarks.make_train import parse_gain, parse_phases, table


def test_phases_add_up_and_count_a_block_that_raised():
    clock = PhaseClock()
    with clock.phase("model"):
        time.sleep(0.05)
    with pytest.raises(RuntimeError), clock.phase("model"):
        time.sleep(0.05)
        raise RuntimeError
    clock.add("training", 2.0)
    s = clock.summary()
    assert 0.1 <= s["model"] < 1.0 and s["training"] == 2.0
    assert s["total"] >= s["model"]


def test_the_time_line_reads_back_as_the_benchmark_parses_it():
    seconds = {"model": 21.0, "servers": 63.0, "evaluation": 125.0, "total": 601.0}
    line = describe_phases(seconds)
    assert line == "time: model 21 s | servers 1 min 3 s | evaluation 2 min 5 s | total 10 min 1 s"
    assert parse_phases(line) == seconds
    assert parse_phases("eval @ step 0: success 0.2") == {}


def test_the_gain_and_the_table():
    out = "...\nheld-out success: 0.180 → 0.914 (+0.734) after 4 steps\nrun directory: x\n"
    assert parse_gain(out) == (0.180, 0.914)
    assert parse_gain("no such line") is None
    figures = {"total_s": 530.0, "install_s": 95.0, "model_s": 21.0, "run_s": 400.0,
               "heldout_before": 0.18, "heldout_after": 0.914, "heldout_gain": 0.734}  # fmt: skip
    t = table(figures).splitlines()
    assert t[0] == "| total | install | model | held-out success |"
    assert t[2] == "| 8 min 50 s | 1 min 35 s | 21 s | 0.180 → 0.914 |"
