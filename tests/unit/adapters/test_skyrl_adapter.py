"""SkyrlEnv on skyrl-gym's own gsm8k envs: skyrl's rows, observations, rewards and errors."""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from agentrl import Action, StopReason
from agentrl.adapters.skyrl import INSTALL_HINT, SkyrlEnv, skyrl_env_class
from agentrl.loading.envs import EnvNotFoundError, resolve_env
from agentrl.loading.task_sources import read_task_source
from agentrl.rollout import AgentLoop
from agentrl.testing.scripted_server import ScriptedLLM, TextPolicy

RECORDER = "agentrl-test-recorder"


def row(answer: str = "5", env_class: str | None = "gsm8k", **extra: Any) -> dict[str, Any]:
    """A task row in skyrl's dataset format."""
    r: dict[str, Any] = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 2+3? End with '#### ANSWER'."}],
        "env_class": env_class,
        "reward_spec": {"method": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": 0},
        **extra,
    }
    return r


def act(text: str, **kw: Any) -> Action:
    return Action(text=text, content=text, **kw)


class Recorder(BaseTextEnv):
    """Keeps what skyrl_gym.make gave it; its step raises on 'boom'."""

    made: ClassVar[list[Recorder]] = []

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.env_config, self.extras = env_config, dict(extras or {})
        Recorder.made.append(self)

    def init(self, prompt: Any) -> tuple[Any, dict[str, Any]]:
        return [{"role": "system", "content": "Be brief."}, *prompt], {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if "boom" in action:
            raise ValueError("the grader is down")
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": f"you said {action}"}],
            reward=0.5,
            done=False,
            metadata={"seen": action},
        )


if RECORDER not in skyrl_gym.registry:
    skyrl_gym.register(id=RECORDER, entry_point=Recorder)


def test_gsm8k_row_maps_prompt_reward_and_done() -> None:
    env = resolve_env("skyrl:gsm8k")()
    assert issubclass(type(env), SkyrlEnv) and type(env).name == "skyrl:gsm8k"
    msgs = env.reset(row())
    assert [(m.role, m.content) for m in msgs] == [("user", row()["prompt"][0]["content"])]
    r = env.step(act("2+3 is 5.\n#### 5"))
    assert (r.reward, r.terminated, r.truncated, list(r.observation)) == (1.0, True, False, [])
    env.reset(row())
    assert env.step(act("#### 6")).reward == 0.0
    env.close()
    env.close()  # idempotent


def test_multi_turn_env_observations_turn_rewards_and_metrics() -> None:
    env = skyrl_env_class("gsm8k_multi_turn")(max_turns=3)
    env.reset(row(env_class="gsm8k_multi_turn"))
    assert env.skyrl_env.max_turns == 3  # passed as extras["max_turns"], as SkyRL does
    first = env.step(act("#### 4"))  # well formatted, wrong: a format score
    assert not first.terminated and 0 < first.reward < 1 and first.metrics == {}
    assert [m.role for m in first.observation] == ["user"]
    assert "#### ANSWER" in first.observation[0].content
    last = env.step(act("#### 5"))
    assert last.terminated and last.reward == 1.0
    assert last.metrics == {"skyrl/steps": 2.0}  # the env's get_metrics, at the episode's end


def test_metrics_also_come_on_the_loops_last_turn() -> None:
    env = skyrl_env_class("gsm8k_multi_turn")()
    env.reset(row(env_class="gsm8k_multi_turn"))
    r = env.step(act("no answer", last_turn=True))
    assert not r.terminated and r.metrics == {"skyrl/steps": 1.0}


def test_row_env_class_extras_and_env_config_reach_the_env_as_in_skyrl() -> None:
    Recorder.made.clear()
    env = skyrl_env_class("gsm8k")(env_config={"db_path": "/data/sql"})
    msgs = env.reset(row(env_class=RECORDER, db_id="concert"))  # the row's env_class wins
    (made,) = Recorder.made
    assert made.env_config.db_path == "/data/sql"  # a DictConfig, attribute access works
    assert set(made.extras) == {"data_source", "reward_spec", "extra_info", "db_id"}
    assert made.extras["reward_spec"] == {"method": "rule", "ground_truth": "5"}
    assert "max_turns" not in made.extras  # not given: the row's or the env's own
    assert [m.role for m in msgs] == ["system", "user"]  # what init returned
    r = env.step(act("hello"))
    assert r.reward == 0.5 and not r.terminated
    assert r.observation[0].content == "you said hello"
    assert r.info == {"skyrl_metadata": {"seen": "hello"}}
    # A row without env_class runs the env the spec names.
    env.reset(row(env_class=None))
    assert type(env.skyrl_env).__name__ == "GSM8kEnv"


def test_parquet_of_skyrl_rows_works_unchanged(tmp_path) -> None:
    path = tmp_path / "train.parquet"
    rows = [row(answer=str(i + 5)) for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    cls = resolve_env("skyrl:gsm8k")
    tasks = read_task_source(str(path))  # as a run reads them: the env has no load_tasks
    assert len(tasks) == 3
    env = cls()
    env.reset(tasks[1])
    assert env.step(act("#### 6")).reward == 1.0


def test_unknown_name_lists_skyrls_registered_envs() -> None:
    with pytest.raises(EnvNotFoundError) as e:
        resolve_env("skyrl:gsm9k")
    msg = str(e.value)
    assert "'gsm9k'" in msg and "gsm8k, gsm8k_multi_turn" in msg and "text2sql" in msg


def test_own_env_module_is_imported_first() -> None:
    cls = resolve_env(f"skyrl:{__name__}:{RECORDER}")
    assert cls.skyrl_name == RECORDER
    with pytest.raises(EnvNotFoundError, match="no_such_module"):
        resolve_env("skyrl:no_such_module:x")


def test_missing_package_is_one_message_naming_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)  # import skyrl_gym raises ImportError
    with pytest.raises(EnvNotFoundError, match=r"pip install 'agentrl\[skyrl\]'"):
        resolve_env("skyrl:gsm8k")
    assert INSTALL_HINT == "pip install 'agentrl[skyrl]'"


def test_bad_row_names_the_env_and_the_cause() -> None:
    env = skyrl_env_class("gsm8k")()
    bad = row()
    del bad["reward_spec"]
    with pytest.raises(RuntimeError, match="skyrl env 'gsm8k': make raised AssertionError: "
                       "reward_spec field is required"):  # fmt: skip
        env.reset(bad)
    with pytest.raises(ValueError, match="'prompt' must be a non-empty list"):
        env.reset({**row(), "prompt": None})


async def test_an_exception_in_the_skyrl_env_ends_that_episode_as_env_error(tokenizer) -> None:
    llm = ScriptedLLM(TextPolicy(tokenizer, lambda _: "boom"))
    env = skyrl_env_class(RECORDER)()
    traj = await AgentLoop(llm, tokenizer).run(env, row(env_class=None))
    assert traj.stop_reason == StopReason.ENV_ERROR
    assert traj.error is not None
    assert f"skyrl env {RECORDER!r}: step raised ValueError: the grader is down" in traj.error
    assert env.skyrl_env is None  # closed
    ok = await AgentLoop(ScriptedLLM(TextPolicy(tokenizer, lambda _: "#### 5")), tokenizer).run(
        skyrl_env_class("gsm8k")(), row()
    )
    assert ok.stop_reason == StopReason.DONE and ok.reward == 1.0, ok.error
