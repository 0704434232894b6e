"""LocalSandbox: model-written code in Linux namespaces on this machine, under hard limits.

Each sandbox is one persistent helper process (``_helper.py``) started by ``unshare`` as
pid 1 of its own pid, mount, ipc, uts and (unless ``limits.network``) network namespaces.
The helper builds a private root: read-only ``/usr`` (+ ``/bin``, ``/lib``...), a minimal
generated ``/etc``, a few device nodes, its own ``/proc``, and one size-limited tmpfs that
holds ``/workspace`` (the working directory), ``/tmp`` and ``/dev/shm``; then pivot_roots
into it, so no host path is reachable. For each exec it forks a child that sets rlimits
(CPU, address space, processes, file size), drops to a random unprivileged uid with
no_new_privs and a seccomp filter that refuses new user namespaces (as Docker's default
profile does: inside one the code would be uid 0 with every capability), and execs the
command. When the command ends or its wall-clock timeout
passes, the helper SIGKILLs every other process in the namespace, so nothing survives a
call. Where a cgroup (v1 or v2) is writable, pids and memory are also capped for the whole
sandbox. Requires root (or CAP_SYS_ADMIN) and ``unshare`` (util-linux).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time
import uuid
from typing import Any, Self

from agentrl.runtime.watchdog import unwatch_path, watch_path
from agentrl.sandbox._cgroup import SandboxCgroups
from agentrl.sandbox.base import (
    LANGUAGES,
    WORKDIR,
    ExecResult,
    SandboxError,
    SandboxLimits,
    code_argv,
    workdir_path,
)

__all__ = ["LANGUAGES", "LocalSandbox"]

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_helper.py")
DEFAULT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
#: language -> argv prefix; the code is appended as the last argument.
_RESERVED = ("/workspace", "/tmp", "/dev", "/proc", "/etc", "/usr")
_DEFAULT_LIMITS = SandboxLimits()
_UID_RANGE = (1_000_000, 2_000_000_000)
_uids_in_use: set[int] = set()
_SETUP_TIMEOUT_S = 30.0
_FORK_TIMEOUT_S = 120.0  # each of: copying the parent's files out, writing the child's
_REPLY_GRACE_S = 10.0


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _new_uid() -> int:
    """A random unprivileged uid that no other sandbox here holds (RLIMIT_NPROC counts per uid)."""
    while True:
        uid = random.randrange(*_UID_RANGE)
        if uid not in _uids_in_use:
            _uids_in_use.add(uid)
            return uid


class LocalSandbox:
    """A Sandbox backed by Linux namespaces on this machine.

    Calls are served one at a time, in order, by the sandbox's helper; after each ``exec``
    no process the command started is left alive.

    Args:
        limits: Resource limits; ``wall_timeout_s`` is the default timeout of every exec.
        workdir_root: Host directory under which the sandbox's (empty, private) root
            mountpoint is created; defaults to the system temp directory.
        ro_binds: Extra host paths to show read-only at the same path inside (e.g. a
            Python installation); by default only the system directories are visible.
        env: Extra environment variables of every command.
    """

    def __init__(
        self,
        limits: SandboxLimits = _DEFAULT_LIMITS,
        *,
        workdir_root: str | None = None,
        ro_binds: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.limits = limits
        self.workdir = WORKDIR
        self._workdir_root = workdir_root
        self._ro_binds = tuple(os.path.abspath(p) for p in ro_binds)
        for path in self._ro_binds:
            if path == "/" or any(_overlaps(path, d) for d in _RESERVED):
                raise ValueError(f"ro_binds path {path!r} overlaps the sandbox's own {_RESERVED}")
        self._env = {**DEFAULT_ENV, **(env or {})}
        self.uid = _new_uid()
        self._proc: asyncio.subprocess.Process | None = None
        self._root: str | None = None
        self._cgroups = SandboxCgroups()
        self._pending: collections.deque[asyncio.Future[dict[str, Any]]] = collections.deque()
        self._reader: asyncio.Task[None] | None = None
        self._stderr_reader: asyncio.Task[None] | None = None
        self._stderr_tail = b""
        self._started = False
        self._closed = False
        self._dead: str | None = None

    # lifecycle ---------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Started, not closed, and its helper has not died."""
        return self._started and not self._closed and self._dead is None

    @property
    def isolation(self) -> dict[str, Any]:
        """What this sandbox's isolation rests on (for logs and the run doctor)."""
        return {
            "namespaces": ["pid", "mount", "ipc", "uts"] + ([] if self.limits.network else ["net"]),
            "uid": self.uid,
            "cgroups": list(self._cgroups.controllers),
            "rlimits": sorted(self._rlimits()),
            "seccomp": ["no new user namespaces"],
        }

    async def start(self) -> None:
        """Starts the helper and builds the sandbox's root; a no-op if already started."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        if self._started:
            return
        unshare = shutil.which("unshare")
        if unshare is None or os.geteuid() != 0:
            raise SandboxError(
                "LocalSandbox needs root (for namespaces, mounts and setuid) and util-linux "
                "`unshare`; run as root or use the docker backend"
            )
        self._started = True
        try:
            await self._spawn(unshare)
        except BaseException:
            await self.close()
            raise

    async def _spawn(self, unshare: str) -> None:
        self._root = tempfile.mkdtemp(prefix="agentrl-sandbox-", dir=self._workdir_root)
        watch_path(self._root)  # removed if this process dies without close()
        lim = self.limits
        self._cgroups = await asyncio.to_thread(
            SandboxCgroups.create,
            uuid.uuid4().hex[:12],
            pids_max=lim.max_processes + 8,
            memory_bytes=(lim.memory_mb + lim.max_disk_mb + 64) << 20,
        )
        namespaces = ["--mount", "--pid", "--ipc", "--uts"] + ([] if lim.network else ["--net"])
        argv = [unshare, *namespaces, "--fork", "--kill-child", "--"]
        argv += [sys.executable, "-I", "-S", HELPER]
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._reader = asyncio.create_task(self._read_replies())
        self._stderr_reader = asyncio.create_task(self._read_stderr())
        config = {
            "root": self._root,
            "uid": self.uid,
            "gid": self.uid,
            "disk_mb": lim.max_disk_mb,
            "ro_binds": list(self._ro_binds),
            "cgroups": list(self._cgroups.dirs),
            "rlimits": self._rlimits(),
            "env": self._env,  # the warm interpreter's (the helper's docstring)
        }
        reply = await asyncio.wait_for(self._call(config), _SETUP_TIMEOUT_S)
        if not reply.get("ok"):
            raise SandboxError(f"sandbox setup failed: {reply.get('error')}")

    def _rlimits(self) -> dict[str, list[int]]:
        lim = self.limits
        mem = lim.memory_mb << 20
        return {
            "RLIMIT_CPU": [lim.cpu_time_s, lim.cpu_time_s + 1],
            "RLIMIT_AS": [mem, mem],
            "RLIMIT_NPROC": [lim.max_processes, lim.max_processes],
            "RLIMIT_FSIZE": [lim.max_file_size_mb << 20] * 2,
            "RLIMIT_NOFILE": [1024, 1024],
            "RLIMIT_CORE": [0, 0],
            "RLIMIT_MEMLOCK": [0, 0],
            "RLIMIT_STACK": [8 << 20, 8 << 20],
        }

    async def close(self) -> None:
        """Kills the helper and with it every process of the sandbox; idempotent."""
        if self._closed:
            return
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            # unshare dies -> --kill-child kills the helper (pid 1) -> the namespace dies
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
        for task in (self._reader, self._stderr_reader):
            if task is not None:
                await task
        self._fail_pending("sandbox closed")
        await asyncio.to_thread(self._cgroups.remove)
        # Empty once the namespace is gone; a helper killed mid-setup can leave files in it
        # (seen under load), so the tree is removed; no symlink inside is followed.
        if self._root is not None and await asyncio.to_thread(_remove_tree, self._root):
            unwatch_path(self._root)
        _uids_in_use.discard(self.uid)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # requests ----------------------------------------------------------------

    async def _read_replies(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        out = self._proc.stdout
        try:
            while True:
                (n,) = struct.unpack(">I", await out.readexactly(4))
                reply = json.loads(await out.readexactly(n))
                fut = self._pending.popleft()
                if not fut.done():  # a cancelled caller's reply is dropped
                    fut.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, IndexError):
            pass
        if self._proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 2.0)
        self._dead = "sandbox helper exited"
        self._fail_pending(self._death_message())

    async def _read_stderr(self) -> None:
        proc = self._proc
        if proc is None or proc.stderr is None:
            return
        while chunk := await proc.stderr.read(4096):
            self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    def _death_message(self) -> str:
        tail = self._stderr_tail.decode(errors="replace").strip()
        return "sandbox helper died" + (f": {tail}" if tail else "")

    def _fail_pending(self, msg: str) -> None:
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(SandboxError(msg))

    async def _call(self, req: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        if self._proc is None or self._proc.stdin is None or self._dead is not None:
            raise SandboxError(self._death_message() if self._dead else "sandbox is not started")
        body = json.dumps(req).encode()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending.append(fut)
        try:
            self._proc.stdin.write(struct.pack(">I", len(body)) + body)
            await self._proc.stdin.drain()
        except (ConnectionError, RuntimeError) as e:
            raise SandboxError(self._death_message()) from e
        if timeout_s is None:
            return await fut
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            await self.close()  # the helper is stuck: nothing it runs may outlive it
            raise SandboxError(f"sandbox did not answer within {timeout_s:.1f}s; closed") from None

    async def _request(self, req: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        await self.start()
        reply = await self._call(req, timeout_s)
        if not reply.get("ok"):
            if reply.get("kind") == "path":
                raise ValueError(reply["error"])
            raise SandboxError(f"sandbox {req['op']} failed: {reply.get('error')}")
        return reply

    # the Sandbox protocol ----------------------------------------------------

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Runs a command (a shell string via ``sh -c``, or an argv list) in ``/workspace``."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        timeout = self.limits.wall_timeout_s if timeout_s is None else timeout_s
        req = {
            "op": "exec",
            "argv": argv,
            "env": {**self._env, **(env or {})},
            "stdin": None if stdin is None else base64.b64encode(stdin.encode()).decode(),
            "timeout": timeout,
            "max_output": self.limits.max_output_bytes,
        }
        t0 = time.perf_counter()
        reply = await self._request(req, timeout + _REPLY_GRACE_S)
        out = self._decode(reply["stdout"], reply["dropped"][0])
        err = self._decode(reply["stderr"], reply["dropped"][1])
        return ExecResult(
            stdout=out,
            stderr=err,
            exit_code=int(reply["exit_code"]),
            timed_out=bool(reply["timed_out"]),
            duration_s=time.perf_counter() - t0,
        )

    @staticmethod
    def _decode(data: str, dropped: int) -> str:
        text = base64.b64decode(data).decode(errors="replace")
        return text + (f"\n[... output truncated: {dropped} more bytes]" if dropped else "")

    async def run_code(
        self, code: str, *, language: str = "python", timeout_s: float | None = None
    ) -> ExecResult:
        """Runs a snippet in a language of ``LANGUAGES`` (the code is passed as an argument)."""
        return await self.exec(code_argv(language, code), timeout_s=timeout_s)

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Writes a file under ``/workspace`` (parents created); other paths raise ValueError."""
        raw = data.encode() if isinstance(data, str) else data
        req = {
            "op": "write",
            "path": workdir_path(path),
            "data": base64.b64encode(raw).decode(),
        }
        await self._request(req)

    async def read_file(self, path: str) -> bytes:
        """Reads a regular file under ``/workspace``; other paths, links out, FIFOs, devices
        and sockets are ValueError (they are never opened in a way that could block)."""
        reply = await self._request({"op": "read", "path": workdir_path(path)})
        return base64.b64decode(reply["data"])

    async def fork(self) -> LocalSandbox:
        """A new, started sandbox whose files are a copy of this one's now.

        Copied: everything under ``/workspace``, ``/tmp`` and ``/dev/shm`` (directories,
        regular files with their modes and mtimes, symlinks; FIFOs and sockets are left out,
        hard links become separate files), owned by the child's own uid. No process
        survives a call, so there is none to copy. The child has the same limits, binds and
        environment, and its own helper, uid and cgroups: from here on the two diverge.
        The caller owns the child (``async with child:``). Cost: a fresh sandbox plus the
        files through the helpers' pipes (``benchmarks/sandbox_fork.py``).

        Raises:
            SandboxError: This sandbox is closed or dead, or the copy failed (the child is
                closed then).
        """
        if self._closed or self._dead is not None:
            raise SandboxError(f"cannot fork a closed sandbox ({self._dead or 'closed'})")
        snap = await self._request({"op": "snapshot"}, _FORK_TIMEOUT_S)
        child = LocalSandbox(
            self.limits, workdir_root=self._workdir_root, ro_binds=self._ro_binds, env=self._env
        )
        try:
            await child.start()
            await child._request({"op": "restore", "entries": snap["entries"]}, _FORK_TIMEOUT_S)
        except BaseException:
            await child.close()
            raise
        return child

    def __deepcopy__(self, memo: dict[int, Any]) -> LocalSandbox:
        # An env's default fork deep-copies its state: a copy would share this live helper.
        raise TypeError("a LocalSandbox is a live process; fork it with `await sandbox.fork()`")

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        """Whether the helper answers a ping within ``timeout_s``."""
        if not self.alive:
            return False
        try:
            await self._request({"op": "ping"}, timeout_s)
        except SandboxError:
            return False
        return True

    async def reset(self) -> None:
        """Kills any process and empties ``/workspace``, ``/tmp`` and ``/dev/shm`` for reuse."""
        await self._request({"op": "reset"})


def _remove_tree(path: str) -> bool:
    """Removes ``path`` (no symlink inside is followed); whether it is gone."""
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)
