"""How :meth:`DockerSandbox.fork` copies a container's files into a new one.

Everything the code in a sandbox can change lies in three places: the two tmpfs volumes
``/workspace`` and ``/tmp``, and ``/dev/shm`` (the root filesystem is read-only). A fork
archives them with ``tar`` run as the sandbox user in the parent (through the resident
exec server: one round trip), while the child container starts, then unpacks the archive
with ``tar`` as the sandbox user in the child: modes, mtimes, symlinks, hard links and
FIFOs are kept (sockets are left out). No process is copied: none survives a call.

Why not ``docker commit`` of the parent and a run of the image: a commit holds the
container's root filesystem layer only, never its volumes, so the child would start with
an empty ``/workspace`` and still need this copy; commit, create and image removal only
add time (1.28x the fork's p50). Nor the engine's archive API (``get_archive`` /
``put_archive``, 1.38x): it resolves paths as root and cannot write ``/dev/shm`` of a
read-only container. A fork costs about a fresh sandbox's start (1.05x at p50 with a
200 KiB workspace, the copy overlapping the start; ``benchmarks/sandbox_fork_docker.py``).

The archive passes through the host's memory and, while it unpacks, the child's resident
exec server's (at most the sizes of the three mounts, within the child's memory limit).
Needs GNU ``tar`` in the image. A file the code made unreadable to itself (``chmod 000``)
fails the fork, naming it: the copy runs with the sandbox user's rights only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from agentrl.sandbox.base import SandboxError, SandboxLimits
from agentrl.sandbox.exec_client import ExecRequest

__all__ = ["FORK_LABEL", "FORK_TIMEOUT_S", "RESTORE", "SNAPSHOT", "fork_into", "snapshot_cap"]

#: Label of a forked container: the id of the container it was forked from.
FORK_LABEL = "agentrl.fork_of"
FORK_TIMEOUT_S = 120.0  # one archive or unpack
# The mounts' contents, not the mounts themselves: the child's are fresh, and /dev/shm is
# root's (tar as uid 1000 could not set its mode).
SNAPSHOT = (
    "cd / && find workspace tmp dev/shm -mindepth 1 -maxdepth 1 -print0"
    " | exec tar --null -T - -cf -\n"
)
RESTORE = "cd / && exec tar -xpf -\n"
_MIB = 1 << 20
log = logging.getLogger(__name__)

Raw = tuple[bytearray, bytearray, dict[int, int], int, bool, float]


class _Container(Protocol):
    """What a fork needs of a DockerSandbox (parent or child)."""

    limits: SandboxLimits

    def _exec_raw(self, req: ExecRequest) -> Raw: ...

    async def _run(self, fn: Any, *args: Any) -> Any: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def snapshot_cap(limits: SandboxLimits) -> int:
    """Most bytes an archive of the three mounts may take (their sizes, twice for headers)."""
    small = max(16, limits.max_disk_mb // 4)  # /tmp and /dev/shm (DockerSandbox.start)
    return 2 * (limits.max_disk_mb + 2 * small) * _MIB


def _tar(box: _Container, script: str, stdin: bytes | None, what: str) -> bytes:
    cap = snapshot_cap(box.limits)
    req = ExecRequest(["sh", "-c", script], FORK_TIMEOUT_S, stdin, None, cap, False)
    out, err, dropped, code, timed_out, _ = box._exec_raw(req)
    why = err.decode("utf-8", errors="replace").strip()[-1000:]
    if timed_out:
        raise SandboxError(f"fork: {what} took over {FORK_TIMEOUT_S:.0f}s: {why}")
    if code != 0:
        raise SandboxError(f"fork: {what} failed (tar exit {code}): {why or 'no message'}")
    if dropped[1]:
        raise SandboxError(f"fork: the archive of the sandbox's files is over {cap} bytes")
    return bytes(out)


async def fork_into(parent: _Container, child: _Container) -> None:
    """Starts ``child`` and copies ``parent``'s files into it.

    On any failure, or a cancellation, ``child`` is closed before this returns.

    Raises:
        SandboxError: The child did not start, or the archive or unpack failed (the reason).
    """
    start = asyncio.ensure_future(child.start())  # the container starts while tar runs
    try:
        archive = await parent._run(_tar, parent, SNAPSHOT, None, "archiving the parent's files")
        await start
        await child._run(_tar, child, RESTORE, archive, "unpacking them in the child")
    except BaseException as e:
        if not isinstance(e, Exception):  # cancelled: stop waiting for the engine
            start.cancel()
        await asyncio.gather(start, return_exceptions=True)
        try:
            await asyncio.shield(child.close())
        except Exception as close_error:  # the owner watchdog removes it at the latest
            log.warning("fork: could not remove the child container: %s", close_error)
        if isinstance(e, Exception) and not isinstance(e, SandboxError):
            raise SandboxError(f"fork failed: {type(e).__name__}: {e}") from e
        raise
