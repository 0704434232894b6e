"""docker_fork.fork_into with container doubles: the copy's order and every failure path
removing the child (the real engine: tests/integration/test_docker_fork.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.sandbox.base import SandboxError, SandboxLimits
from agentrl.sandbox.docker_fork import RESTORE, SNAPSHOT, fork_into, snapshot_cap
from agentrl.sandbox.exec_client import ExecRequest


class Box:
    """A DockerSandbox double: scripted tar results, recorded calls."""

    def __init__(self, code: int = 0, out: bytes = b"", *, start_error: bool = False) -> None:
        self.limits = SandboxLimits(max_disk_mb=32)
        self.code, self.out, self.start_error = code, out, start_error
        self.requests: list[ExecRequest] = []
        self.started = self.closed = False
        self.start_delay = 0.0

    def _exec_raw(self, req: ExecRequest) -> Any:
        self.requests.append(req)
        return bytearray(self.out), bytearray(b"tar: boom"), {1: 0, 2: 0}, self.code, False, 0.0

    async def _run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    async def start(self) -> None:
        await asyncio.sleep(self.start_delay)
        if self.start_error:
            raise SandboxError("could not start")
        self.started = True

    async def close(self) -> None:
        self.closed = True


async def test_archive_of_parent_is_unpacked_in_child() -> None:
    parent, child = Box(out=b"TAR"), Box()
    await fork_into(parent, child)
    assert [r.argv[-1] for r in parent.requests] == [SNAPSHOT]
    assert [(r.argv[-1], r.stdin) for r in child.requests] == [(RESTORE, b"TAR")]
    assert child.started and not child.closed and not parent.closed
    assert parent.requests[0].cap == snapshot_cap(parent.limits) == 2 * (32 + 32) << 20
    assert not parent.requests[0].kill_background


@pytest.mark.parametrize("where", ["archive", "start", "unpack"])
async def test_a_failure_names_the_step_and_removes_the_child(where: str) -> None:
    parent = Box(code=2 if where == "archive" else 0)
    child = Box(code=2 if where == "unpack" else 0, start_error=where == "start")
    with pytest.raises(SandboxError) as err:
        await fork_into(parent, child)
    want = {"archive": "archiving", "start": "could not start", "unpack": "unpacking"}[where]
    assert want in str(err.value)
    assert child.closed and not parent.closed
    if where != "start":
        assert "tar exit 2" in str(err.value) and "boom" in str(err.value)


async def test_other_errors_become_sandbox_errors() -> None:
    class Broken(Box):
        def _exec_raw(self, req: ExecRequest) -> Any:
            raise OSError("engine socket closed")

    child = Box()
    with pytest.raises(SandboxError, match="OSError: engine socket closed"):
        await fork_into(Broken(), child)
    assert child.closed


async def test_cancelled_fork_removes_the_child() -> None:
    child = Box()
    child.start_delay = 10.0
    task = asyncio.ensure_future(fork_into(Box(), child))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert child.closed and not child.started


async def test_oversized_archive_is_refused() -> None:
    class Full(Box):
        def _exec_raw(self, req: ExecRequest) -> Any:
            return bytearray(b"x"), bytearray(), {1: 5, 2: 0}, 0, False, 0.0

    child = Box()
    with pytest.raises(SandboxError, match="archive of the sandbox's files is over"):
        await fork_into(Full(), child)
    assert child.closed
