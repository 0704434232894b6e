"""SandboxPool: warm hand-out, reset between episodes, replacement of broken sandboxes."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from typing import ClassVar, Self

import pytest

from agentrl.sandbox import (
    ExecResult,
    LocalSandbox,
    SandboxError,
    SandboxLimits,
    SandboxPool,
    make_sandbox,
)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="LocalSandbox needs root and util-linux unshare",
)


class FakeSandbox:
    """An in-memory Sandbox that records its lifecycle."""

    made: ClassVar[list[FakeSandbox]] = []

    def __init__(self, *, fail_start: bool = False, fail_reset: bool = False) -> None:
        self.files: dict[str, bytes] = {}
        self.started = self.closed = False
        self.resets = 0
        self.fail_start, self.fail_reset = fail_start, fail_reset
        FakeSandbox.made.append(self)

    @property
    def alive(self) -> bool:
        return self.started and not self.closed

    async def start(self) -> None:
        if self.fail_start:
            raise SandboxError("cannot start")
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def exec(self, cmd: str | list[str], **kw: object) -> ExecResult:
        return ExecResult("", "", 0)

    async def run_code(self, code: str, **kw: object) -> ExecResult:
        return ExecResult("", "", 0)

    async def write_file(self, path: str, data: str | bytes) -> None:
        self.files[path] = data.encode() if isinstance(data, str) else data

    async def read_file(self, path: str) -> bytes:
        return self.files[path]

    async def reset(self) -> None:
        if self.fail_reset:
            raise SandboxError("reset failed")
        self.resets += 1
        self.files.clear()


@pytest.fixture(autouse=True)
def _clear_made() -> None:
    FakeSandbox.made = []


async def settle(pool: SandboxPool) -> None:
    """Waits until no sandbox is being recycled."""
    for _ in range(500):
        if pool.metrics["idle"] + pool.metrics["in_use"] == pool.size:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(pool.metrics)


async def test_hands_out_started_sandboxes_and_resets_them() -> None:
    async with SandboxPool(FakeSandbox, size=1) as pool:
        async with pool.acquire() as sb:
            assert isinstance(sb, FakeSandbox) and sb.alive
            await sb.write_file("secret", "episode 1")
        await settle(pool)
        async with pool.acquire() as again:
            assert again is sb and again.files == {} and sb.resets == 1
        m = pool.metrics
        assert (m["created"], m["acquired"], m["replaced"]) == (1, 2, 0)
        assert m["acquire_ms_p50"] >= 0


async def test_bounds_concurrency_to_size() -> None:
    peak = 0

    async def episode(pool: SandboxPool) -> None:
        nonlocal peak
        async with pool.acquire():
            peak = max(peak, int(pool.metrics["in_use"]))
            await asyncio.sleep(0.02)

    async with SandboxPool(FakeSandbox, size=2) as pool:
        await asyncio.gather(*(episode(pool) for _ in range(6)))
        assert peak == 2 and pool.metrics["acquired"] == 6 and pool.metrics["created"] == 2


async def test_a_pool_without_prestart_grows_on_demand_up_to_its_size() -> None:
    async with SandboxPool(FakeSandbox, size=2, prestart=0) as pool:
        assert pool.metrics["created"] == 0  # nothing started before an episode needs one
        async with pool.acquire() as a:
            assert a.alive and pool.metrics["created"] == 1
            async with pool.acquire() as b:  # none idle, room left: a second one
                assert b is not a and pool.metrics["created"] == 2
                cm = pool.acquire()
                third = asyncio.ensure_future(cm.__aenter__())
                await asyncio.sleep(0.05)
                assert not third.done()  # at size: waits for a return
        assert await asyncio.wait_for(third, 5) in (a, b)
        await cm.__aexit__(None, None, None)
        assert pool.metrics["created"] == 2 and pool.metrics["acquired"] == 3
    with pytest.raises(ValueError, match="prestart"):
        SandboxPool(FakeSandbox, size=2, prestart=3)


async def test_replaces_a_sandbox_that_raised_or_failed_reset_or_died() -> None:
    async with SandboxPool(lambda: FakeSandbox(fail_reset=len(FakeSandbox.made) == 1), 1) as pool:
        with pytest.raises(SandboxError):
            async with pool.acquire() as first:
                raise SandboxError("died mid-episode")
        await settle(pool)
        async with pool.acquire() as second:  # this one's reset will fail
            assert second is not first and first.closed
        await settle(pool)
        async with pool.acquire() as third:
            assert third is not second and second.closed
            await third.close()  # no longer alive on return
        await settle(pool)
        async with pool.acquire() as fourth:
            assert fourth is not third and fourth.alive
        assert pool.metrics["replaced"] == 3 and pool.metrics["created"] == 4


async def test_max_uses_retires_a_sandbox() -> None:
    async with SandboxPool(FakeSandbox, size=1, max_uses=2) as pool:
        for _ in range(3):
            async with pool.acquire():
                pass
            await settle(pool)
        assert len(FakeSandbox.made) == 2 and FakeSandbox.made[0].closed


async def test_start_failure_raises_and_closes_the_rest() -> None:
    pool = SandboxPool(lambda: FakeSandbox(fail_start=len(FakeSandbox.made) == 1), size=3)
    with pytest.raises(SandboxError, match="1/3"):
        await pool.start()
    assert all(sb.closed for sb in FakeSandbox.made)
    assert pool.metrics["failures"] == 1


async def test_close_is_idempotent_and_closes_everything() -> None:
    pool = SandboxPool(FakeSandbox, size=2)
    async with pool.acquire():
        pass
    await pool.close()
    await pool.close()
    assert len(FakeSandbox.made) == 2 and all(sb.closed for sb in FakeSandbox.made)
    with pytest.raises(SandboxError, match="closed"):
        async with pool.acquire():
            pass


async def test_acquire_timeout() -> None:
    async with SandboxPool(FakeSandbox, size=1, acquire_timeout_s=0.05) as pool, pool.acquire():
        with pytest.raises(TimeoutError):
            async with pool.acquire():
                pass


def test_make_sandbox_registry() -> None:
    assert isinstance(make_sandbox("local", limits=SandboxLimits()), LocalSandbox)
    with pytest.raises(ValueError, match="valid kinds: docker, local"):
        make_sandbox("nope")


@needs_root
async def test_local_pool_nothing_leaks_across_episodes() -> None:
    limits = SandboxLimits(wall_timeout_s=3.0, max_disk_mb=8)
    async with SandboxPool(lambda: LocalSandbox(limits), size=1) as pool:
        async with pool.acquire() as sb:
            uid = getattr(sb, "uid", None)
            await sb.write_file("answer.txt", "42")
            await sb.exec("echo cached > /tmp/cache")
        await settle(pool)
        async with pool.acquire() as sb2:
            assert getattr(sb2, "uid", None) == uid  # the same warm sandbox, reused
            r = await sb2.exec("ls -A /workspace /tmp")
            assert r.stdout.split() == ["/tmp:", "/workspace:"]


@needs_root
async def test_local_pool_replaces_a_dead_sandbox() -> None:
    async with SandboxPool(lambda: LocalSandbox(SandboxLimits(wall_timeout_s=3.0)), 1) as pool:
        with pytest.raises(SandboxError):
            async with pool.acquire() as sb:
                assert isinstance(sb, LocalSandbox) and sb._proc is not None
                os.killpg(sb._proc.pid, 9)
                await sb.exec("true")
        await settle(pool)
        async with pool.acquire() as fresh:
            assert fresh is not sb and (await fresh.exec("echo ok")).stdout == "ok\n"
        assert pool.metrics["replaced"] == 1 and pool.metrics["created"] == 2


async def _until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_warm_starts_the_rest_in_the_background_and_episodes_take_them() -> None:
    async with SandboxPool(FakeSandbox, size=3, prestart=1, warm=5) as pool:
        assert pool.metrics["created"] == 1  # start waited for the prestarted one only
        await _until(lambda: pool.metrics["idle"] == 3)
        async with pool.acquire(), pool.acquire(), pool.acquire():
            pass
        assert pool.metrics["created"] == 3  # warm is capped at size; none started on demand
    with pytest.raises(ValueError, match="warm"):
        SandboxPool(FakeSandbox, size=2, warm=-1)


async def test_a_warm_start_that_fails_is_counted_and_an_episode_starts_its_own() -> None:
    calls = 0

    def factory() -> FakeSandbox:
        nonlocal calls
        calls += 1
        return FakeSandbox(fail_start=calls == 1)  # the warm-up's one start fails

    async with SandboxPool(factory, size=1, prestart=0, warm=1) as pool:
        await _until(lambda: pool.metrics["failures"] == 1)
        async with pool.acquire() as sb:
            assert sb.alive and pool.metrics["created"] == 1


class StuckSandbox(FakeSandbox):
    """Starts at once for the first two made; every later one hangs in ``start``."""

    async def start(self) -> None:
        if FakeSandbox.made.index(self) >= 2:
            await asyncio.Event().wait()
        await super().start()


async def test_closing_during_the_warm_up_closes_every_sandbox_it_started() -> None:
    FakeSandbox.made.clear()
    pool = SandboxPool(StuckSandbox, size=8, prestart=0, warm=8, warm_concurrency=2)
    await pool.start()
    await _until(lambda: len(FakeSandbox.made) == 4)  # two started, two hang in start
    await pool.close()
    assert len(FakeSandbox.made) == 4
    assert all(sb.closed for sb in FakeSandbox.made)
    assert pool.metrics["created"] == 2 and pool.metrics["closed"] == 2
