"""The scale benchmarks' statistics: percentiles, the RSS slope, lost sessions."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from benchmarks import scale_episodes, scale_gateway
from benchmarks.stats import after_warmup, percentile, rss_bytes, slope


def test_percentile_interpolates_between_the_two_nearest_ranks() -> None:
    values = [40, 10, 30, 20]  # sorted: 10 20 30 40; rank of q: 3 * q / 100
    assert percentile(values, 0) == 10
    assert percentile(values, 50) == 25  # rank 1.5: halfway between 20 and 30
    assert percentile(values, 99) == pytest.approx(39.7)  # rank 2.97: 30 + 0.97 * 10
    assert percentile(values, 100) == 40
    assert percentile([7], 99) == 7
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="in \\[0, 100\\]"):
        percentile(values, 101)


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([0, 1, 2, 3], [5, 7, 9, 11]) == 2.0
    # (0,0) (1,1) (2,0) (3,1): mean x 1.5, mean y 0.5; sxy = 1, sxx = 5: slope 0.2
    assert slope([0, 1, 2, 3], [0, 1, 0, 1]) == pytest.approx(0.2)
    assert slope([0, 1000, 2000], [100, 100, 100]) == 0.0
    with pytest.raises(ValueError, match="two points"):
        slope([1], [1])
    with pytest.raises(ValueError, match="distinct"):
        slope([1, 1], [1, 2])


def test_the_slope_leaves_out_the_warmup() -> None:
    samples = [(0, 50), (100, 90), (200, 100), (300, 100), (400, 100)]
    assert after_warmup(samples, 200) == [(200, 100), (300, 100), (400, 100)]
    why: Counter[str] = Counter()
    r = scale_episodes.summarize(samples, episodes=400, warmup=0.5, wall_s=2.0, why=why)
    assert r["slope_bytes_per_episode"] == 0.0 and r["flat"]
    assert r["rss_warm_mib"] == 100 / 2**20 and r["rss_start_mib"] == 50 / 2**20
    assert r["episodes_per_s"] == 200 and r["unexpected"] == 0
    # 2 KiB more per episode after the warm-up: growing.
    growing = [(x, 2048 * x) for x in (0, 100, 200, 300, 400)]
    r = scale_episodes.summarize(growing, episodes=400, warmup=0.5, wall_s=1.0, why=why)
    assert r["slope_bytes_per_episode"] == pytest.approx(2048) and not r["flat"]
    with pytest.raises(ValueError, match="--batch"):
        scale_episodes.summarize(samples, episodes=400, warmup=0.9, wall_s=1.0, why=why)


def test_rss_of_this_process_is_read_from_proc() -> None:
    assert 10 * 2**20 < rss_bytes() < 64 * 2**30


def _session(
    turns: int = 4, segments: float = 1.0, stop: str | None = None, error: str | None = None
) -> dict:
    return {"turns": turns, "segments": segments, "stop_reason": stop, "error": error}


def test_a_session_is_lost_when_missing_short_rewritten_or_ended() -> None:
    assert scale_gateway.lost_sessions([_session(), _session()], expected=2, turns=4) == {}
    lost = scale_gateway.lost_sessions(
        [_session(), _session(turns=3), _session(segments=2), _session(stop="llm_error")],
        expected=6,
        turns=4,
    )
    assert lost == {
        "missing": 2,
        "3 turns, not 4": 1,
        "2 segments": 1,
        "ended: llm_error": 1,
    }


def test_the_episode_check_names_what_went_wrong() -> None:
    class T:
        def __init__(self) -> None:
            self.stop_reason, self.error, self.reward, self.num_turns = "done", None, 1.0, 2
            self.metrics = {"tool_calls": 1}

    assert scale_episodes.unexpected(T()) is None
    t = T()
    t.reward = 0.0
    assert scale_episodes.unexpected(t) == "reward 0.0"
    t = T()
    t.stop_reason = "max_turns"
    assert scale_episodes.unexpected(t) == "stop max_turns"


async def test_the_episode_benchmarks_env_and_policy_end_as_expected() -> None:
    from agentrl.models.tokenizer import build_tokenizer
    from agentrl.rollout import AgentLoop
    from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

    tok = build_tokenizer(seed=0)
    loop = AgentLoop(ScriptedLLM(TextPolicy(tok, scale_episodes.tool_then_answer)), tok)
    traj = await loop.run(scale_episodes.Sum(), {"a": 40, "b": 2})
    assert scale_episodes.unexpected(traj) is None, traj.error
    assert traj.messages[-1].content == "ANSWER 42"
    assert scale_episodes.kept_trajectory_bytes(traj) > 8 * len(traj.token_ids)
