"""The env registry: built-in names, module:Class and file.py:Class specs, clear errors."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl import Env, Message, StepResult
from agentrl.loading import envs as env_registry
from agentrl.loading.envs import (
    EnvNotFoundError,
    InvalidEnvError,
    list_envs,
    register_env,
    resolve_env,
)
from tests.helpers.paths import REPO

ENV_SOURCE = textwrap.dedent(
    """
    from agentrl import Env, Message, StepResult

    class FileEnv(Env):
        def reset(self, task, *, seed=None):
            return [Message.user("hi")]

        def step(self, action):
            return StepResult(reward=1.0, terminated=True)

    class NotAnEnv:
        pass

    def make_env():
        return FileEnv()
    """
)


class Dummy(Env):
    def reset(self, task, *, seed=None):
        return [Message.user("x")]

    def step(self, action):
        return StepResult(terminated=True)


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    saved = dict(env_registry._REGISTRY)
    yield
    env_registry._REGISTRY.clear()
    env_registry._REGISTRY.update(saved)


def test_builtin_retool_resolves_by_name() -> None:
    from agentrl.envs.retool import RetoolEnv

    assert resolve_env("retool") is RetoolEnv
    assert "retool" in list_envs()


def test_register_decorator_and_function() -> None:
    @register_env("my-dummy")
    class Mine(Dummy):
        pass

    assert resolve_env("my-dummy") is Mine
    register_env("other-dummy", Dummy)
    assert resolve_env("other-dummy") is Dummy
    assert {"my-dummy", "other-dummy"} <= set(list_envs())


def test_register_lazy_string_target() -> None:
    register_env("lazy-dummy", f"{__name__}:Dummy")
    assert resolve_env("lazy-dummy") is Dummy


def test_register_conflict_needs_replace() -> None:
    register_env("taken", Dummy)
    register_env("taken", Dummy)  # the same class again is fine (module re-import)

    class Other(Dummy):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register_env("taken", Other)
    register_env("taken", Other, replace=True)
    assert resolve_env("taken") is Other


def test_register_rejects_non_env() -> None:
    with pytest.raises(InvalidEnvError, match=r"not a subclass of agentrl\.Env"):
        register_env("bad", dict)  # type: ignore[arg-type]  # the wrong type on purpose


def test_module_colon_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user_env_mod_x1.py").write_text(ENV_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = resolve_env("user_env_mod_x1:FileEnv")
    assert issubclass(cls, Env) and cls.__name__ == "FileEnv"


def test_file_colon_class(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "my_env.py"
    path.parent.mkdir()
    path.write_text(ENV_SOURCE)
    cls = resolve_env(f"{path}:FileEnv")
    assert cls.__name__ == "FileEnv"
    assert cls().step(None).reward == 1.0  # type: ignore[arg-type]  # step ignores it
    assert resolve_env(f"{path}:FileEnv") is cls  # loaded once


def test_hello_example_resolves_by_relative_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    cls = resolve_env("examples/hello_env.py:SayWord")
    assert issubclass(cls, Env)


def test_unknown_name_lists_envs_and_suggests() -> None:
    with pytest.raises(EnvNotFoundError) as e:
        resolve_env("retol")
    msg = str(e.value)
    assert "Did you mean 'retool'?" in msg
    assert "Available envs:" in msg and "retool" in msg


def test_unknown_far_name_lists_without_suggestion() -> None:
    with pytest.raises(EnvNotFoundError) as e:
        resolve_env("zzzzzzzz")
    assert "Did you mean" not in str(e.value)
    assert "retool" in str(e.value)


def test_dotted_name_hints_colon_form() -> None:
    with pytest.raises(EnvNotFoundError, match=r"write 'my_pkg.mod:MyEnv'"):
        resolve_env("my_pkg.mod.MyEnv")


def test_missing_module_and_attribute(tmp_path: Path) -> None:
    with pytest.raises(EnvNotFoundError, match="no module named 'no_such_pkg_abc'"):
        resolve_env("no_such_pkg_abc.mod:X")
    path = tmp_path / "e.py"
    path.write_text(ENV_SOURCE)
    with pytest.raises(EnvNotFoundError, match=r"no attribute 'Missing'.*FileEnv"):
        resolve_env(f"{path}:Missing")
    with pytest.raises(EnvNotFoundError, match="does not exist"):
        resolve_env(f"{tmp_path / 'nope.py'}:X")


def test_non_env_targets_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "e2.py"
    path.write_text(ENV_SOURCE)
    with pytest.raises(InvalidEnvError, match=r"NotAnEnv.*not a subclass of agentrl\.Env"):
        resolve_env(f"{path}:NotAnEnv")
    with pytest.raises(InvalidEnvError, match="not a subclass"):
        resolve_env(f"{path}:make_env")


def test_entry_point_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = importlib.metadata.EntryPoint(
        name="ep-dummy", value=f"{__name__}:Dummy", group=env_registry.ENTRY_POINT_GROUP
    )

    def fake_entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return [ep] if group == env_registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(env_registry.importlib.metadata, "entry_points", fake_entry_points)
    assert "ep-dummy" in list_envs()
    assert resolve_env("ep-dummy") is Dummy


def test_gym_prefix_wraps_gymnasium_env() -> None:
    from agentrl.adapters.gym import GymnasiumEnv

    cls = resolve_env("gym:FrozenLake-v1")
    assert issubclass(cls, GymnasiumEnv)
    env = cls(make_kwargs={"is_slippery": False})  # type: ignore[call-arg]  # bound id
    assert "[S]" in env.reset({}, seed=0)[-1].content


def test_same_class_imported_twice_is_not_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    path = tmp_path / "twice.py"
    path.write_text(ENV_SOURCE)
    classes = []
    for mod_name in ("twice_a", "pkg_alias.twice_a"):
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, mod_name, module)
        spec.loader.exec_module(module)
        classes.append(module.FileEnv)
    assert classes[0] is not classes[1]
    for cls in classes:  # e.g. envs.retool and agentrl.envs.retool
        register_env("twice", cls)
    assert resolve_env("twice") is classes[1]
