"""GymnasiumEnv on FrozenLake (deterministic): text observations, action parsing, passthrough."""

from __future__ import annotations

import gymnasium as gym
import pytest

from agentrl import Action
from agentrl.adapters.gym import GymnasiumEnv, ansi_to_text
from agentrl.testing import check_env

NAMES = ["left", "down", "right", "up"]
# FrozenLake 4x4: S at (0,0), G at (3,3); this path avoids every hole.
WINNING = ["down", "down", "right", "right", "down", "right"]


def lake(**kw: object) -> GymnasiumEnv:
    return GymnasiumEnv(
        "FrozenLake-v1",
        make_kwargs={"is_slippery": False, **kw.pop("make_kwargs", {})},  # type: ignore[dict-item]
        action_names=NAMES,
        **kw,  # type: ignore[arg-type]  # test helper forwards keyword arguments
    )


def act(text: str) -> Action:
    return Action(text=text, content=text)


def test_reset_renders_ansi_grid_with_position_and_help() -> None:
    env = lake(instructions="Reach G without falling into H.")
    msgs = env.reset({}, seed=0)
    assert [m.role for m in msgs] == ["system", "user"]
    assert msgs[0].content == "Reach G without falling into H."
    assert msgs[1].content.startswith("[S]FFF\nFHFH\nFFFH\nHFFG")
    assert "left, down, right, up" in msgs[1].content
    assert "\x1b" not in msgs[1].content


def test_winning_path_gives_reward_and_terminates() -> None:
    env = lake()
    env.reset({}, seed=0)
    results = [env.step(act(f"I move {a}.")) for a in WINNING]
    assert [r.reward for r in results] == [0.0] * 5 + [1.0]
    assert [r.terminated for r in results] == [False] * 5 + [True]
    assert results[-1].observation == []
    assert results[0].observation[0].content == "(Down)\nSFFF\n[F]HFH\nFFFH\nHFFG"
    assert results[0].info["action"] == 1


def test_falling_in_hole_terminates_with_zero() -> None:
    env = lake()
    env.reset({}, seed=0)
    env.step(act("right"))
    r = env.step(act("down"))  # (1,1) is a hole
    assert r.terminated and r.reward == 0.0


def test_parse_takes_last_integer_or_name() -> None:
    env = lake()
    assert env.parse("not left, go RIGHT") == 2
    assert env.parse("action 3") == 3
    assert env.parse("down... no, 0") == 0
    assert env.parse("action 7") is None  # out of range
    assert env.parse("leftover") is None  # whole words only
    assert env.parse("nothing") is None


def test_invalid_action_tells_model_counts_and_penalizes() -> None:
    env = lake(invalid_action_penalty=0.1, max_invalid_actions=2)
    env.reset({}, seed=0)
    r = env.step(act("hmm, let me think"))
    assert r.reward == pytest.approx(-0.1)
    assert not r.terminated and not r.truncated
    assert r.metrics["invalid_action"] == 1.0
    assert r.observation[0].content.startswith("Invalid action.")
    assert "left, down, right, up" in r.observation[0].content
    assert env.step(act("down")).metrics["invalid_action"] == 0.0  # state untouched: (1,0)
    assert env.step(act("???")).truncated  # second invalid reply hits the cap


def test_truncation_passes_through_time_limit() -> None:
    env = lake(make_kwargs={"max_episode_steps": 2})
    env.reset({}, seed=0)
    assert not env.step(act("up")).truncated
    r = env.step(act("up"))
    assert r.truncated and not r.terminated


def test_custom_render_and_parse() -> None:
    env = GymnasiumEnv(
        gym.make("FrozenLake-v1", is_slippery=False),
        render_obs=lambda obs: f"state={obs}",
        parse_action=lambda text: {"a": 2, "b": 1}.get(text.strip()),
    )
    assert env.reset({}, seed=0)[-1].content.startswith("state=0")
    assert env.step(act("a")).observation[0].content == "state=1"
    assert env.step(act("zzz")).metrics["invalid_action"] == 1.0


def test_str_obs_fallback_without_ansi() -> None:
    env = GymnasiumEnv("CartPole-v1")
    content = env.reset({}, seed=0)[-1].content
    assert content.startswith("[")  # str() of the numpy observation
    assert "integer from 0 to 1" in content


def test_rejects_non_discrete_action_space() -> None:
    with pytest.raises(TypeError, match="Discrete"):
        GymnasiumEnv("MountainCarContinuous-v0")


def test_passes_env_checker() -> None:
    check_env(lake())


def test_ansi_to_text() -> None:
    assert ansi_to_text("\x1b[41mS\x1b[0mF\n") == "[S]F"
