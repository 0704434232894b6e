"""DockerSandboxPool past capacity: acquirers queue (bounded by ``max_waiting``, each for at
most ``acquire_timeout_s``) and then run; past a bound, one error naming the setting.

The pool's containers are doubles (its ``factory``): no Docker engine is needed.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from agentrl.sandbox.docker import DockerSandbox
from agentrl.sandbox.docker_pool import DockerSandboxPool, PoolCapacityError, PoolWaitTimeout


class FakeContainer:
    """Stands in for a DockerSandbox: starts and closes, nothing else."""

    def __init__(self) -> None:
        self.dead = False
        self.closed = False
        self.started_s = 0.0

    async def start(self) -> None:
        await asyncio.sleep(0)

    async def close(self) -> None:
        self.closed = True


def _pool(size: int, **kw: Any) -> DockerSandboxPool:
    def factory() -> DockerSandbox:
        return cast(DockerSandbox, FakeContainer())

    return DockerSandboxPool(size, health_interval_s=0, reap=False, factory=factory, **kw)


async def _until(cond: Any) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached within 5 s")


async def test_requests_past_capacity_queue_and_then_run() -> None:
    async with _pool(2, max_waiting=4) as pool:
        held = [await pool.acquire(), await pool.acquire()]
        waiters = [asyncio.create_task(pool.acquire()) for _ in range(4)]
        await _until(lambda: pool.waiting == 4)
        assert not any(w.done() for w in waiters)  # queued, not failed
        for sb in held:
            await pool.release(sb)
        got = [await w for w in asyncio.as_completed(waiters[:2])]
        assert len(got) == 2 and pool.metrics()["leased"] == 2
        for sb in got:
            await pool.release(sb)
        rest = [await w for w in asyncio.as_completed(waiters[2:])]
        assert len(rest) == 2
        m = pool.metrics()
        assert (m["queued"], m["waiting"], m["refused"], m["wait_timeouts"]) == (4, 0, 0, 0)
        assert m["max_wait_ms"] > 0


async def test_one_past_max_waiting_gets_one_error_naming_the_setting() -> None:
    async with _pool(1, max_waiting=2) as pool:
        held = await pool.acquire()
        waiters = [asyncio.create_task(pool.acquire()) for _ in range(2)]
        await _until(lambda: pool.waiting == 2)
        with pytest.raises(PoolCapacityError, match=r"max_waiting=2.*raise max_waiting"):
            await pool.acquire()
        assert pool.metrics()["refused"] == 1
        await pool.release(held)  # the queued ones still run
        first = await waiters[0]
        await pool.release(first)
        await waiters[1]
        assert pool.waiting == 0


async def test_no_queue_when_max_waiting_is_zero() -> None:
    async with _pool(1, max_waiting=0) as pool:
        await pool.acquire()
        with pytest.raises(PoolCapacityError, match="max_waiting=0"):
            await pool.acquire()


async def test_the_wait_is_bounded_by_acquire_timeout_s() -> None:
    async with _pool(1, acquire_timeout_s=0.2) as pool:
        await pool.acquire()
        with pytest.raises(PoolWaitTimeout, match="raise acquire_timeout_s") as err:
            await pool.acquire()
        assert isinstance(err.value, TimeoutError)  # callers catching TimeoutError still do
        with pytest.raises(TimeoutError):
            await pool.acquire(timeout_s=0.05)  # a per-call wait overrides the pool's
        m = pool.metrics()
        assert (m["wait_timeouts"], m["waiting"]) == (2, 0)  # a timed-out waiter leaves


@pytest.mark.parametrize(
    "kw", [{"max_waiting": -1}, {"acquire_timeout_s": 0}, {"acquire_timeout_s": float("inf")}]
)
def test_bad_bounds_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        _pool(1, **kw)
