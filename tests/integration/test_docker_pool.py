"""DockerSandboxPool: warm hand-out, admission control, no dirty reuse, replacement, reaping."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import pytest

from agentrl.sandbox.base import SandboxError
from agentrl.sandbox.docker import LABEL
from agentrl.sandbox.docker_pool import DockerSandboxPool
from agentrl.sandbox.images import docker_client
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
docker_image = docker_fixtures.docker_image  # the session fixture, under its own name


def _pool(image: str, size: int, **kw: Any) -> DockerSandboxPool:
    return DockerSandboxPool(size, image, LIMITS, health_interval_s=0, **kw)


async def test_warm_handout_and_fresh_container_per_episode(docker_image: str) -> None:
    async with _pool(docker_image, 2) as pool:
        m = pool.metrics()
        assert (m["warm"], m["alive"], m["leased"]) == (2, 2, 0)
        warm_ids = {sb.container_id for sb in pool._warm}
        sb = await pool.acquire()
        assert sb.container_id in warm_ids  # handed out, not created on demand
        first = sb.container_id
        await sb.write_file("dirt.txt", "episode 1")
        await sb.exec("echo x > /tmp/dirt")
        await pool.release(sb)
        await pool.wait_warm()
        seen = set()
        for _ in range(2):
            nxt = await pool.acquire()
            seen.add(nxt.container_id)
            r = await nxt.exec("ls /workspace/dirt.txt /tmp/dirt")
            assert r.exit_code != 0  # nothing of episode 1 is there
        assert first not in seen
        m = pool.metrics()
        assert m["leased"] == 2 and m["acquire_p50_ms"] > 0 and m["exec_p50_ms"] > 0


async def test_reset_mode_reuses_a_clean_container(docker_image: str) -> None:
    async with _pool(docker_image, 1, reuse="reset") as pool:
        async with pool.sandbox() as sb:
            first = sb.container_id
            await sb.write_file("dirt.txt", "x")
        async with pool.sandbox() as sb:
            assert sb.container_id == first
            assert (await sb.exec("ls -A /workspace")).stdout == ""


async def test_admission_control_bounds_leases(docker_image: str) -> None:
    async with _pool(docker_image, 1) as pool:
        held = await pool.acquire()
        with pytest.raises(TimeoutError):
            await pool.acquire(timeout_s=0.5)
        waiter = asyncio.create_task(pool.acquire(timeout_s=60))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await pool.release(held)
        got = await waiter
        assert got is not held and (await got.exec("echo ok")).stdout == "ok\n"
        assert pool.metrics()["leased"] == 1


async def test_crashed_and_hung_containers_are_replaced(docker_image: str) -> None:
    client = docker_client()
    async with _pool(docker_image, 2) as pool:
        crashed, hung = list(pool._warm)
        client.containers.get(crashed.container_id).kill()
        client.containers.get(hung.container_id).pause()
        assert await pool.check_health() == 2
        await pool.wait_warm()
        ids = {sb.container_id for sb in pool._warm}
        assert crashed.container_id not in ids and hung.container_id not in ids
        for sb in [await pool.acquire(), await pool.acquire()]:
            assert (await sb.exec("echo ok")).ok
        assert pool.metrics()["replaced"] == 2
        # A leased container dying mid-episode: exec fails clearly, release replaces it.
        sb = next(iter(pool._leased))
        cid = sb.container_id
        client.containers.get(cid).kill()
        with pytest.raises(SandboxError):
            await sb.exec("true")
        await pool.release(sb)
    assert not client.containers.list(all=True, filters={"id": cid})


async def test_resize_follows_concurrency(docker_image: str) -> None:
    async with _pool(docker_image, 1) as pool:
        await pool.resize(3)
        await pool.wait_warm()
        assert pool.metrics()["alive"] == 3
        await pool.resize(1)
        await asyncio.sleep(0.5)
        assert pool.metrics()["alive"] == 1


async def test_start_reaps_orphans_of_a_killed_run(docker_image: str) -> None:
    client = docker_client()
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    labels = {LABEL: "1", "agentrl.host": os.uname().nodename, "agentrl.pid": str(dead.pid)}
    orphan = client.containers.run(docker_image, ["sleep", "60"], detach=True, labels=labels)
    async with _pool(docker_image, 1):
        assert not client.containers.list(all=True, filters={"id": orphan.id})


async def test_engine_failures_reach_acquirers(docker_image: str) -> None:
    with pytest.raises(SandboxError, match="No such image"):
        async with DockerSandboxPool(1, "agentrl/nope:0", LIMITS, health_interval_s=0):
            pass
    pool = DockerSandboxPool(1, "agentrl/nope:0", LIMITS, health_interval_s=0)
    try:
        with pytest.raises(SandboxError, match="failed in a row"):
            await pool.acquire(timeout_s=60)
        assert pool.metrics()["failures"] >= 3
    finally:
        await pool.close()


@pytest.mark.parametrize("after_s", [0.0, 0.3, 0.8])
async def test_close_while_containers_are_created_leaves_none(
    docker_image: str, after_s: float
) -> None:
    # close() mid-fill: the engine threads of the in-flight creates finish after their
    # tasks are cancelled; what they create must be gone when close() returns, not later
    # (a run exits right after closing its pools, and the watchdog only reaps at its exit).
    run_id = f"close-{uuid.uuid4().hex[:8]}"
    pool = _pool(docker_image, 4, max_concurrent_starts=4, reap=False, run_id=run_id)
    await pool.start(wait=False)
    await asyncio.sleep(after_s)
    await pool.close()
    client = docker_client()
    label = {"label": f"agentrl.run={run_id}"}
    assert client.containers.list(all=True, filters=label) == []
    assert client.volumes.list(filters=label) == []
