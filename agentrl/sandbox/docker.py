"""DockerSandbox: model-written code in a hardened, disposable Docker container.

Hardened by default: no network (``network_mode=none``), every capability dropped,
``no-new-privileges``, commands run as uid 1000, a read-only root filesystem with two
size-limited tmpfs volumes (``/workspace``, the working directory, and ``/tmp``), memory
with swap equal to it (no swap), a CPU quota, a process-count limit, per-process CPU-time
and file-size rlimits, and ``tini`` as pid 1 reaping orphans. The container's idle process
runs as ``nobody`` so sandboxed code cannot kill it.

Each exec runs under a small shell wrapper (``agentrl.sandbox.docker_scripts``):
``timeout -s KILL`` in its own process group enforces the wall clock; when the command ends,
the rest of its process group is killed, and (unless ``kill_background=False``) so is every
other process of uid 1000 when no other exec is running its command (told by what the code
cannot forge: exec processes have no parent inside the container). The host keeps a second
deadline and, past it, kills every uid-1000 process from a fresh exec; a sandbox that still
does not answer is marked dead. ``read_file``, ``write_file`` and ``download`` also run as
uid 1000 in the container (paths resolved with the sandbox user's rights), never through
the engine's archive API, which resolves paths as root. Containers and volumes carry labels
naming their owner, so :func:`reap_orphans` removes those a killed run left behind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import io
import logging
import os
import posixpath
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from agentrl.runtime.watchdog import watch_docker
from agentrl.sandbox import docker_scripts as scripts
from agentrl.sandbox.base import (
    WORKDIR,
    ExecResult,
    SandboxError,
    SandboxLimits,
    code_argv,
    workdir_path,
)
from agentrl.sandbox.docker_fork import FORK_LABEL, fork_into
from agentrl.sandbox.docker_io import finish, pump, remove_retrying, tar_upload, text
from agentrl.sandbox.docker_owner import LABEL, RUN_ID, owner_labels, reap_orphans
from agentrl.sandbox.exec_client import ExecRequest, ResidentExec, ServerUnavailable

__all__ = ["LABEL", "RUN_ID", "WORKDIR", "DockerSandbox", "owner_labels", "reap_orphans"]

UID = scripts.UID  # every command, and every file operation, runs as this user
IDLE_UID = 65534  # the container's idle process: out of reach of uid 1000's signals
DEFAULT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_GRACE_S = 5.0  # host-side slack past the in-container deadline
_FILE_TIMEOUT_S = 60.0  # one read_file / write_file / download
log = logging.getLogger(__name__)
_MIB = 1 << 20
# How long close() keeps trying to remove a container and its volumes when the engine
# fails (e.g. dockerd restarting: its socket refuses, or a pooled connection is stale).
_REMOVE_RETRY_S = 60.0
_DEFAULT_LIMITS = SandboxLimits()
_executor = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="docker-sb")


class DockerSandbox:
    """One hardened container; see the module docstring for the security model.

    Args:
        image: Image tag; None builds/uses ``agentrl/python`` (see ``agentrl.sandbox.images``).
        limits: Resource limits (memory is the container's, with swap equal to it).
        client: A docker SDK client; the local engine by default.
        labels: Extra container labels (owner labels are always added).
        run_id: Run id label; this process's by default.
        cpus: CPU quota of the container.
        network: Docker network when ``limits.network`` is True (an allowlist is a network
            whose reachability you control); ignored otherwise (``none``).
        kill_background: Kill processes a command leaves behind once it ends.
        resident_exec: Run commands through a resident server in the container
            (:mod:`agentrl.sandbox.exec_server`, one round trip instead of a
            ``docker exec``, which costs ~50 ms); images without ``python3``, and calls
            made while it is busy, use ``docker exec``.
        on_exec: Called (from a worker thread) with each exec's result, e.g. for metrics.
    """

    def __init__(
        self,
        image: str | None = None,
        limits: SandboxLimits = _DEFAULT_LIMITS,
        *,
        client: Any = None,
        labels: dict[str, str] | None = None,
        run_id: str = RUN_ID,
        cpus: float = 1.0,
        network: str | None = None,
        kill_background: bool = True,
        resident_exec: bool = True,
        on_exec: Callable[[ExecResult], None] | None = None,
    ) -> None:
        if limits.network and not network:
            raise ValueError("limits.network=True needs network=<docker network name>")
        self.image = image
        self.limits = limits
        self.cpus = cpus
        self.network = network if limits.network else "none"
        self.kill_background = kill_background
        self.resident_exec = resident_exec
        self._resident: ResidentExec | None = None
        #: How the execs went: through the resident server, or a ``docker exec``.
        self.exec_paths = {"resident": 0, "docker_exec": 0}
        self._on_exec = on_exec
        self._client = client
        self._labels = {**(labels or {}), **owner_labels(run_id)}
        self._container: Any = None
        self._volumes: list[Any] = []
        self._closed = False
        self._close_work: asyncio.Future[None] | None = None  # close()'s engine calls
        self._start_work: asyncio.Future[None] | None = None  # the engine calls of start()
        self._lock = threading.Lock()
        self._remove_lock = threading.Lock()
        self.dead = False  # the engine or container failed; replace, do not reuse
        self.started_s = 0.0  # seconds start() took (cold start)

    # ---------------------------------------------------------------- lifecycle
    @property
    def container_id(self) -> str:
        """The container's id ('' before start)."""
        return str(self._container.id) if self._container is not None else ""

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(_executor, fn, *args)

    async def start(self) -> None:
        """Creates and starts the container (and its two tmpfs volumes)."""
        if self._container is not None:
            return
        if self._closed:
            raise SandboxError("sandbox already closed")
        work = asyncio.get_running_loop().run_in_executor(_executor, self._start_sync)
        self._start_work = work
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            # The engine call goes on in its thread and the caller will never hold this
            # sandbox: whatever it creates is removed as soon as it returns.
            with self._lock:
                self._closed = True
            work.add_done_callback(self._remove_after_start)
            raise

    def _remove_after_start(self, work: asyncio.Future[None]) -> None:
        if not work.cancelled():
            work.exception()  # retrieved: the error of a start nobody waits for is moot
        _executor.submit(self._close_sync)

    def _start_sync(self) -> None:
        from agentrl.sandbox.images import docker_client, ensure_image

        t0 = time.perf_counter()
        self._client = self._client or docker_client()
        self.image = self.image or ensure_image("python", client=self._client)
        owner = ("agentrl.host", "agentrl.pid", "agentrl.pid_start")
        watch_docker({LABEL: "1", **{k: self._labels[k] for k in owner}})  # die with us
        lim = self.limits
        try:
            work = self._volume(f"size={lim.max_disk_mb}m,mode=0755")
            tmp = self._volume(f"size={max(16, lim.max_disk_mb // 4)}m,mode=1777")
            from docker.types import Mount, Ulimit

            container = self._client.containers.create(
                self.image,
                ["sleep", "infinity"],
                init=True,
                user=f"{IDLE_UID}:{IDLE_UID}",
                working_dir=WORKDIR,
                environment=DEFAULT_ENV,
                hostname="sandbox",
                labels=self._labels,
                network_mode=self.network,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                read_only=True,
                mounts=[
                    Mount(WORKDIR, work.name, type="volume"),
                    Mount("/tmp", tmp.name, type="volume"),
                ],
                shm_size=f"{max(16, lim.max_disk_mb // 4)}m",
                mem_limit=f"{lim.memory_mb}m",
                memswap_limit=f"{lim.memory_mb}m",
                nano_cpus=int(self.cpus * 1e9),
                pids_limit=lim.max_processes,
                ulimits=[
                    Ulimit(name="cpu", soft=lim.cpu_time_s, hard=lim.cpu_time_s + 1),
                    Ulimit(
                        name="fsize",
                        soft=lim.max_file_size_mb * _MIB,
                        hard=lim.max_file_size_mb * _MIB,
                    ),
                    Ulimit(name="core", soft=0, hard=0),
                    Ulimit(name="nofile", soft=1024, hard=1024),
                ],
            )
            with self._lock:  # close() may have run meanwhile: then remove it here
                self._container = container
                if self._closed:
                    raise SandboxError("closed while starting")
            container.start()
            if self.resident_exec:
                user = f"{UID}:{UID}"
                self._resident = ResidentExec(self._client.api, container.id, user, WORKDIR)
        except Exception as e:
            self._close_sync()
            raise SandboxError(f"could not start a container from {self.image!r}: {e}") from e
        self.started_s = time.perf_counter() - t0

    def _volume(self, opts: str) -> Any:
        o = f"{opts},uid={UID},gid={UID},nosuid,nodev"
        vol = self._client.volumes.create(
            driver="local",
            driver_opts={"type": "tmpfs", "device": "tmpfs", "o": o},
            labels=self._labels,
        )
        with self._lock:
            self._volumes.append(vol)
            if self._closed:
                raise SandboxError("closed while starting")
        return vol

    async def close(self) -> None:
        """Removes the container and its volumes; idempotent.

        A start still in flight in its engine thread (its caller cancelled) is waited for
        first: what it creates is removed before ``close`` returns, not after, so a run
        that exits right after closing its sandboxes leaves no container behind.
        """
        with self._lock:
            self._closed = True
        work = self._start_work
        if work is not None and not work.done():
            await asyncio.wait([work])  # _start_sync sees _closed and removes what it made
        if work is not None and not work.cancelled():
            work.exception()  # retrieved here; start() raised it to its own caller
        first = self._close_work is None
        if self._close_work is None:
            self._close_work = asyncio.get_running_loop().run_in_executor(
                _executor, self._close_sync
            )
        # A close() cancelled mid-way (a pool's retiring task) leaves the removal running
        # in its thread: a later close() waits for it rather than returning at once.
        if not self._close_work.done():
            await asyncio.wait([self._close_work])
        if first:
            self._close_work.result()

    def _close_sync(self) -> None:
        # Serialized: a second caller (close() beside the start thread's own clean-up)
        # returns only once the first has removed everything, not while it still is.
        with self._remove_lock:
            with self._lock:
                self._closed = True
                container, volumes = self._container, self._volumes
                self._volumes = []
            if self._resident is not None:
                self._resident.drop()
            deadline = time.monotonic() + _REMOVE_RETRY_S
            if container is not None:
                remove_retrying(lambda: container.remove(force=True, v=True), deadline)
            for vol in volumes:
                remove_retrying(functools.partial(vol.remove, force=True), deadline)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _require(self) -> str:
        if self._container is None or self._closed:
            raise SandboxError("sandbox is not started (or already closed)")
        if self.dead:
            raise SandboxError(f"sandbox {self._container.short_id} is dead; replace it")
        return str(self._container.id)

    async def reset(self) -> None:
        """Kills every process of the code and empties ``/workspace``, ``/tmp``, ``/dev/shm``."""
        self._require()
        await self._run(self._reset_sync)

    def _reset_sync(self) -> None:
        # A plain exec (no wrapper): `kill -1` spares only its caller and uid-65534 pid 1.
        cmd = (
            "kill -s KILL -- -1 2>/dev/null; chmod -R u+rwx /workspace /tmp /dev/shm 2>/dev/null;"
            " find /workspace /tmp /dev/shm -mindepth 1 -delete 2>/dev/null;"
            ' [ -z "$(ls -A /workspace /tmp /dev/shm | grep -v :)" ]'
        )
        try:
            code, out = self._container.exec_run(["sh", "-c", cmd], user=f"{UID}:{UID}")
        except Exception as e:
            code, out = -1, str(e).encode()
        if self._resident is not None:  # killed with the rest: the next exec restarts it
            self._resident.drop()
        if code != 0:
            self.dead = True
            raise SandboxError(f"reset failed (exit {code}): {out[-500:]!r}")

    async def fork(self) -> DockerSandbox:
        """A new, started sandbox whose files are a copy of this one's now.

        Copied: ``/workspace``, ``/tmp`` and ``/dev/shm``, all the code can write (no
        process: none survives a call); how and at what cost: :mod:`.docker_fork`. The
        child has this one's image, limits, hardening and owner labels (plus
        ``agentrl.fork_of``); the two diverge from here. The caller owns it (``async
        with child:``); a pool never sees it.

        Raises:
            SandboxError: This sandbox is closed or dead, or the copy failed (the child
                is removed first).
        """
        self._require()
        child = DockerSandbox(
            self.image, self.limits, client=self._client,
            labels={**self._labels, FORK_LABEL: self.container_id},
            run_id=self._labels["agentrl.run"], cpus=self.cpus,
            network=None if self.network == "none" else self.network,
            kill_background=self.kill_background, resident_exec=self.resident_exec,
            on_exec=self._on_exec,
        )  # fmt: skip
        await fork_into(self, child)
        return child

    def __deepcopy__(self, memo: dict[int, Any]) -> DockerSandbox:
        # An env's default fork deep-copies its state: a copy would share this container.
        raise TypeError("a DockerSandbox is a live container; fork it with `await sandbox.fork()`")

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        """Whether the container runs and answers a trivial exec within ``timeout_s``."""
        try:
            res = await asyncio.wait_for(self.exec(["true"], timeout_s=timeout_s), timeout_s + 1)
        except (SandboxError, TimeoutError):
            return False
        return res.ok

    # --------------------------------------------------------------------- exec
    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Runs ``cmd`` (a shell string or argv) as uid 1000 in ``/workspace``.

        The whole process tree is killed at ``timeout_s`` (default ``limits.wall_timeout_s``);
        exit code -N means killed by signal N; output past ``limits.max_output_bytes`` is cut.
        """
        self._require()
        t = self.limits.wall_timeout_s if timeout_s is None else timeout_s
        if t <= 0:
            raise ValueError(f"timeout_s must be positive, got {t}")
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        req = ExecRequest(
            argv, t, stdin.encode() if stdin is not None else None, env,
            self.limits.max_output_bytes, self.kill_background,
        )  # fmt: skip
        result: ExecResult = await self._run(self._exec_sync, req)
        return result

    def _exec_sync(self, req: ExecRequest) -> ExecResult:
        out, err, dropped, code, timed_out, elapsed = self._exec_raw(req)
        result = ExecResult(
            stdout=text(out, dropped[1]),
            stderr=text(err, dropped[2]),
            exit_code=code,
            timed_out=timed_out,
            duration_s=elapsed,
        )
        if self._on_exec is not None:
            self._on_exec(result)
        return result

    def _exec_raw(
        self, req: ExecRequest
    ) -> tuple[bytearray, bytearray, dict[int, int], int, bool, float]:
        """Runs ``req`` under the wrapper as uid 1000: (stdout, stderr, bytes dropped per
        stream, exit code, timed out, seconds)."""
        import docker.errors

        t0 = time.perf_counter()
        server = self._resident
        if server is not None and server.lock.acquire(blocking=False):
            try:
                got = self._exec_resident(server, req, t0)
            finally:
                server.lock.release()
            if got is not None:
                return got
        self.exec_paths["docker_exec"] += 1
        api = self._client.api
        t, cap = req.t, req.cap
        wrapped = ["sh", "-c", scripts.WRAPPER, "agentrl-exec", f"{t:.3f}"]
        wrapped += ["1" if req.kill_background else "0", *req.argv]
        try:
            ex = api.exec_create(
                self._require(), wrapped, stdin=True, user=f"{UID}:{UID}",
                workdir=WORKDIR, environment=req.env or None,
            )  # fmt: skip
            sock = api.exec_start(ex["Id"], socket=True)
        except (docker.errors.APIError, OSError) as e:  # OSError: the engine went away
            self.dead = True
            raise SandboxError(f"exec failed in sandbox: {type(e).__name__}: {e}") from e
        raw = getattr(sock, "_sock", sock)
        bufs: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        dropped = {1: 0, 2: 0}
        try:
            done = pump(raw, req.stdin or b"", t0 + t + _GRACE_S, bufs, dropped, cap)
            if not done:  # the in-container deadline failed: kill everything of uid 1000
                self._kill_all()
                done = pump(raw, b"", time.perf_counter() + _GRACE_S, bufs, dropped, cap)
            if not done:
                self.dead = True
                raise SandboxError(f"exec did not end {t + 2 * _GRACE_S:.0f}s after its start")
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        code = None
        for _ in range(50):
            try:
                info = api.exec_inspect(ex["Id"])
            except (docker.errors.APIError, OSError) as e:
                self.dead = True
                raise SandboxError(f"exec status unknown: {type(e).__name__}: {e}") from e
            if not info.get("Running") and info.get("ExitCode") is not None:
                code = int(info["ExitCode"])
                break
            time.sleep(0.01)
        if code is None:
            self.dead = True
            raise SandboxError("exec ended without an exit code (container died?)")
        return finish(bufs, dropped, code, t, t0)

    def _exec_resident(
        self, server: ResidentExec, req: ExecRequest, t0: float
    ) -> tuple[bytearray, bytearray, dict[int, int], int, bool, float] | None:
        """``_exec_raw`` through the resident server; None where it cannot take the call
        (nothing ran: use ``docker exec``)."""
        t = req.t
        try:  # past the deadline: kill all, whose EOF on the stream ends the wait
            res = server.run(req, t0 + t + _GRACE_S, lambda: self._kill_all(forget_server=False))
        except ServerUnavailable as e:
            log.debug("resident exec unavailable, using docker exec: %s", e)
            return None
        if res is None:
            self.dead = True
            raise SandboxError(f"exec did not end {t + 2 * _GRACE_S:.0f}s after its start")
        self.exec_paths["resident"] += 1
        # No exit status: the server died with the command (killed, e.g. `kill -9 -1`),
        # which a `docker exec` of the wrapper reports as 137.
        code = 137 if res.code is None else res.code
        return finish(res.bufs, res.dropped, code, t, t0)

    def _kill_all(self, forget_server: bool = True) -> None:
        """Kills every process of uid 1000, the resident exec server included."""
        with contextlib.suppress(Exception):
            # The shell's builtin: procps' `kill` refuses `-1` after `--` (a usage error).
            self._container.exec_run(["sh", "-c", "kill -s KILL -- -1"], user=f"{UID}:{UID}")
        if forget_server and self._resident is not None:
            self._resident.drop()

    async def run_code(
        self, code: str, *, language: str = "python", timeout_s: float | None = None
    ) -> ExecResult:
        """Runs a snippet in a language of ``LANGUAGES`` (the code is passed as an argument)."""
        return await self.exec(code_argv(language, code), timeout_s=timeout_s)

    # -------------------------------------------------------------------- files
    def _put(self, tar: bytes) -> None:
        try:
            ok = self._client.api.put_archive(self._require(), WORKDIR, tar)
        except Exception as e:
            raise SandboxError(f"copy into the sandbox failed: {e}") from e
        if not ok:
            raise SandboxError("copy into the sandbox failed")

    def _file_op(self, script: str, path: str, stdin: bytes | None = None) -> bytes:
        """Runs a file script of ``docker_scripts`` on ``path`` as uid 1000; its stdout.

        Raises:
            FileNotFoundError: No such file (or directory on the way).
            ValueError: The path resolves outside ``/workspace`` or is not a regular file.
            SandboxError: Anything else (a full disk, a timeout).
        """
        cap = max(self.limits.max_disk_mb, 1) * _MIB
        argv = ["sh", "-c", script, "agentrl-file", path]
        req = ExecRequest(argv, _FILE_TIMEOUT_S, stdin, None, cap, kill_background=False)
        out, err, dropped, code, timed_out, _ = self._exec_raw(req)
        why = err.decode("utf-8", errors="replace").strip()[-500:]
        if code == scripts.EXIT_MISSING:
            raise FileNotFoundError(why or f"no such file in the sandbox: {path}")
        if code in (scripts.EXIT_OUTSIDE, scripts.EXIT_NOT_REGULAR):
            raise ValueError(why)
        if code != 0 or timed_out:
            raise SandboxError(f"file operation on {path} failed (exit {code}): {why}")
        if dropped[1]:
            raise SandboxError(f"{path} is larger than the sandbox disk ({cap} bytes)")
        return bytes(out)

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Writes a file under ``/workspace`` (parents created) as the sandbox user.

        Raises:
            ValueError: The path is (or resolves, through links) outside ``/workspace``, or
                names something other than a regular file (a link, FIFO, directory...).
        """
        full = workdir_path(path)
        if full == WORKDIR:
            raise ValueError("cannot write the working directory itself")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._run(self._file_op, scripts.WRITE, full, raw)

    async def read_file(self, path: str) -> bytes:
        """Reads a regular file under ``/workspace`` as the sandbox user.

        Raises:
            FileNotFoundError: There is no such file.
            ValueError: The path is (or resolves, through links) outside ``/workspace``, or
                names something other than a regular file (a link, FIFO, directory...).
        """
        full = workdir_path(path)
        if full == WORKDIR:
            raise ValueError(f"{path} is a directory, not a regular file")
        data: bytes = await self._run(self._file_op, scripts.READ, full)
        return data

    async def upload(self, local: str | os.PathLike[str], dest: str = ".") -> None:
        """Copies a host file or directory's contents to ``dest`` under ``/workspace``.

        A file goes to ``dest`` (inside it, keeping its name, if ``dest`` is ``.`` or ends
        with ``/``); a directory's contents go into directory ``dest``.
        """
        rel = posixpath.relpath(workdir_path(dest), WORKDIR)
        into = rel == "." or str(dest).endswith("/")
        tar = await self._run(tar_upload, Path(local), rel, into)
        await self._run(self._put, tar)

    async def copy_dir_in(self, local_dir: str | os.PathLike[str], dest: str = ".") -> None:
        """Copies the contents of host directory ``local_dir`` into ``dest`` (``/workspace``)."""
        if not await self._run(Path(local_dir).is_dir):
            raise NotADirectoryError(local_dir)
        await self.upload(local_dir, dest)

    async def download(self, path: str, local: str | os.PathLike[str]) -> Path:
        """Copies a file or directory from ``/workspace`` into host directory ``local``.

        The archive is extracted with tarfile's ``data`` filter (no absolute paths, no
        ``..``, no links out, no device files), since its content is untrusted.
        """
        src = workdir_path(path)

        def _get() -> Path:
            script = scripts.TAR_WORKDIR if src == WORKDIR else scripts.TAR
            data = self._file_op(script, src)  # tar runs as uid 1000 in the container
            out = Path(local)
            out.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(data)) as tf:
                tf.extractall(out, filter="data")
            return out / posixpath.basename(src)

        return await self._run(_get)
