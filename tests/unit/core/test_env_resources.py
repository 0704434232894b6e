"""An env's run-wide resources (Env.run_resources): opened once, given to every env, closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agentrl import Env
from agentrl.orchestration.startup import (
    ComponentError,
    Prepared,
    open_env_resources,
    with_env_resources,
)

EVENTS: list[str] = []


class Shared(Env):
    def __init__(self, *, level: int = 0, shared: object = None) -> None:
        self.level, self.shared = level, shared

    @classmethod
    def run_resources(cls, **kw: Any) -> contextlib.AbstractAsyncContextManager[Any] | None:
        @contextlib.asynccontextmanager
        async def scope() -> AsyncIterator[dict[str, Any]]:
            if kw.get("level") == 99:
                raise OSError("no room for the pool")
            EVENTS.append(f"open {kw}")
            yield {"shared": "the-pool"}
            EVENTS.append("close")

        return scope()


async def test_resources_reach_every_env_and_close_with_the_run() -> None:
    EVENTS.clear()
    cfg: Any = SimpleNamespace(env_kwargs={"level": 3})
    prep = Prepared(cfg, Shared, Shared, [], [], "", None, cast(Any, None), cast(Any, None))
    async with contextlib.AsyncExitStack() as stack:
        extra = await open_env_resources(Shared, {"level": 3}, stack)
        assert extra == {"shared": "the-pool"} and EVENTS == ["open {'level': 3}"]
        env = with_env_resources(prep, extra).env_factory()
        assert isinstance(env, Shared) and (env.level, env.shared) == (3, "the-pool")
        assert with_env_resources(prep, {}) is prep  # nothing shared: the same factory
        assert EVENTS == ["open {'level': 3}"]
    assert EVENTS[-1] == "close"


async def test_an_env_whose_resources_cannot_start_stops_the_run_by_name() -> None:
    async with contextlib.AsyncExitStack() as stack:
        with pytest.raises(ComponentError, match=r"env Shared: .*no room for the pool"):
            await open_env_resources(Shared, {"level": 99}, stack)


async def test_envs_share_nothing_by_default() -> None:
    class Plain(Env):
        pass

    async with contextlib.AsyncExitStack() as stack:
        assert await open_env_resources(Plain, {}, stack) == {}


async def test_a_ray_rollout_worker_opens_its_resources_once_and_closes_them(
    tokenizer: Any, tmp_path: Any
) -> None:
    from agentrl.orchestration.placement.actors import RolloutWorker
    from agentrl.rollout import LoopConfig

    EVENTS.clear()
    tokenizer.save_pretrained(tmp_path)
    spec = f"{Shared.__module__}:Shared"

    def worker(level: int) -> RolloutWorker:  # the plain class a Ray actor wraps
        return RolloutWorker(
            ["http://127.0.0.1:9"], str(tmp_path), spec, {"level": level}, LoopConfig(),
            group_size=2, max_concurrency=2,
        )  # fmt: skip

    w = worker(3)
    await asyncio.gather(w.start(), w.start())
    assert EVENTS == ["open {'level': 3}"]
    env = cast(Shared, w.runner.env_factory())
    assert (env.level, env.shared) == (3, "the-pool")
    await w.close()
    await w.close()
    assert EVENTS == ["open {'level': 3}", "close"]
    with pytest.raises(RuntimeError, match="closed"):
        await w.start()

    bad = worker(99)
    with pytest.raises(ComponentError, match=r"env Shared: .*no room for the pool"):
        await bad.run_group({"prompt": "x"}, index=0, seed=0, tag="i0")
    await bad.close()
