"""Pushing trainer weights to every vLLM server and bumping the weight version.

CPU path (:class:`WeightSync`): write the weights as safetensors to shared memory
(``/dev/shm``), then on every server at once: ``POST /pause?mode=<mode>`` →
``/collective_rpc`` ``reload_weights(weights_path=<dir>)`` → ``/reset_prefix_cache``
(running requests preempted, so kept requests recompute their KV on the new
weights) → ``/update_weight_version`` → ``/resume``. Pause modes:

- ``keep``: in-flight requests freeze and continue on the new weights (partial
  rollout); their tokens carry the version that produced each of them.
- ``wait``: in-flight requests finish on the old weights first.
- ``abort``: in-flight requests end now with finish_reason "abort".

GPU path (:class:`NcclWeightSync`): vLLM's NCCL weight-transfer engine broadcasts
the tensors from the trainer's GPU into the servers' GPUs, between the same
pause/resume and version bump.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from agentrl.inference.protocol import LLMError
from agentrl.inference.router import Router, ServerState
from agentrl.runtime.watchdog import unwatch_path, watch_path

__all__ = [
    "NcclWeightSync",
    "PauseMode",
    "SyncReport",
    "WeightSync",
    "await_recovery",
    "control_client",
    "new_weights_dir",
    "remove_weights_dir",
    "shm_base",
    "write_safetensors",
]

PauseMode = Literal["keep", "wait", "abort"]


@dataclass(frozen=True)
class SyncReport:
    """What one sync did.

    Attributes:
        version: The new weight version.
        seconds: Wall time of the whole sync.
        write_s: Time spent writing the weights.
        pause_s: Per server URL, seconds from sending ``/pause`` to ``/resume`` returning.
        num_bytes: Size of the weights pushed.
    """

    version: int
    seconds: float
    write_s: float
    pause_s: dict[str, float] = field(default_factory=dict)
    num_bytes: int = 0


def write_safetensors(weights: Mapping[str, Any], directory: Path) -> int:
    """Writes ``weights`` to ``directory/model.safetensors``; returns its size in bytes.

    Tensors sharing storage (tied embeddings) are written once, under the first name.
    """
    from safetensors.torch import save_file

    seen: set[tuple[int, int]] = set()
    out = {}
    for name, t in weights.items():
        t = t.detach()
        key = (
            (t.untyped_storage().data_ptr(), t.storage_offset()) if t.device.type == "cpu" else None
        )
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        out[name] = t.to("cpu").contiguous()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.safetensors"
    save_file(out, str(path), metadata={"format": "pt"})
    return path.stat().st_size


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every control client: building one (CA bundle included) took
    ~20-50 ms of the event loop's CPU per weight push, beside ~70 ms for the push itself."""
    return ssl.create_default_context()


def control_client(timeout_s: float, router: Router) -> httpx.AsyncClient:
    """An HTTP client for a fleet's control routes (``/pause``, adapter loads, …): the
    router's headers (its server key), the shared TLS context, ``timeout_s``."""
    return httpx.AsyncClient(timeout=timeout_s, verify=_ssl_context(), headers=router.headers)


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def shm_base() -> str:
    """Where weight files go: ``/dev/shm`` (memory) when it exists, else the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def new_weights_dir(prefix: str, base: str | None = None) -> Path:
    """A fresh directory for weight files in ``base`` (default :func:`shm_base`), removed
    by the watchdog if this process dies before :func:`remove_weights_dir`."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base or shm_base()))
    watch_path(path)
    return path


def remove_weights_dir(path: Path) -> None:
    """Deletes a :func:`new_weights_dir` directory and unregisters it (idempotent)."""
    shutil.rmtree(path, ignore_errors=True)
    unwatch_path(path)


def _state_dict(weights: Any) -> Mapping[str, Any]:
    if hasattr(weights, "state_dict"):
        return dict(weights.state_dict())
    if isinstance(weights, Mapping):
        return weights
    raise TypeError(f"weights must be a state dict, a torch module or a path, not {type(weights)}")


def _keyed(client: Any, headers: Mapping[str, str]) -> Any:
    """vLLM's weight-transfer HTTP client, sending ``headers`` (the server key) too."""
    if not headers:
        return client

    def post(path: str, json: dict[str, Any] | None = None) -> None:
        r = httpx.post(
            f"{client.base_url}/{path}", json=json, timeout=client.timeout, headers=dict(headers)
        )
        r.raise_for_status()

    client._post = post
    return client


async def await_recovery(
    router: Router, version: int, timeout_s: float, what: str, error: str, *, new: str
) -> None:
    """Waits up to ``timeout_s`` for a healthy server at ``version`` or newer (a fleet's
    recovery loads the current weights into a restarted server) after a push no server
    took.

    Raises:
        LLMError: None came back in time; names ``what`` failed, ``error`` and the
            ``new`` things it waited for.
    """
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if any(s.healthy and s.weight_version >= version for s in router.servers):
            return
        await asyncio.sleep(0.25)
    raise LLMError(
        f"{what} v{version} failed on every server ({error}) and no server came back "
        f"with the new {new} within {timeout_s:.0f} s"
    )


class WeightSync:
    """Pushes weights to a fleet's servers through shared memory (CPU path).

    Args:
        router: The router whose servers get the weights.
        mode: Default pause mode.
        shm_dir: Where weight files go (default ``/dev/shm`` when it exists).
        timeout_s: Timeout of each control call.
        recover_timeout_s: When no server took a push (all failed, hung, or were out
            of rotation), how long :meth:`push` waits for one to come back with the new
            weights (a fleet's recovery loads them) before it fails.
    """

    def __init__(
        self,
        router: Router,
        *,
        mode: PauseMode = "keep",
        shm_dir: str | None = None,
        timeout_s: float = 300.0,
        recover_timeout_s: float = 900.0,
    ) -> None:
        self.router = router
        self.mode: PauseMode = mode
        self.timeout_s = timeout_s
        self.recover_timeout_s = recover_timeout_s
        self._root = new_weights_dir("agentrl-weights-", shm_dir)
        self.version = max((s.weight_version for s in router.servers), default=0)
        self.weights_path: Path | None = None
        self._lock = asyncio.Lock()

    def close(self) -> None:
        """Deletes the weight files (idempotent)."""
        remove_weights_dir(self._root)

    async def push(
        self, weights: Any, *, mode: PauseMode | None = None, version: int | None = None
    ) -> SyncReport:
        """Loads ``weights`` into every healthy server and bumps the version.

        Args:
            weights: A state dict, a torch module, or a directory that already
                holds ``*.safetensors`` in the served model's checkpoint format.
            mode: Pause mode for this sync (default: the one given at construction).
            version: Label the weights with this version (default: the current one + 1);
                e.g. the current version, to load a run's starting weights into servers
                it attached to.

        A server that fails or is taken out of rotation (its health checks failed)
        during the sync is left behind: it gets these weights when it recovers. When no
        server took them, the push waits (without holding the sync lock, so a recovering
        server can load them) up to ``recover_timeout_s`` for one to come back with them.

        Raises:
            LLMError: No server took the weights, and none came back with them in time.
        """
        report, error = await self._push_locked(weights, mode, version)
        if error is None:
            return report
        await self._await_recovery(report.version, error)
        return report

    async def _await_recovery(self, version: int, error: str) -> None:
        await await_recovery(
            self.router, version, self.recover_timeout_s, "weight sync", error, new="weights"
        )

    async def _push_locked(
        self, weights: Any, mode: PauseMode | None, label: int | None
    ) -> tuple[SyncReport, str | None]:
        async with self._lock:
            t0 = time.monotonic()
            version = self.version + 1 if label is None else label
            if isinstance(weights, str | Path):
                path = Path(weights)
                size = await asyncio.to_thread(_dir_size, path)
            else:
                path = self._root / f"v{version}"
                sd = _state_dict(weights)
                size = await asyncio.to_thread(write_safetensors, sd, path)
            write_s = time.monotonic() - t0
            servers = [s for s in self.router.servers if s.healthy]
            results = await asyncio.gather(
                *(self._guarded(s, self._sync_one(s, path, version, mode or self.mode))
                  for s in servers),
                return_exceptions=True,
            )  # fmt: skip
            errors = [
                (s, r)
                for s, r in zip(servers, results, strict=True)
                if isinstance(r, BaseException)
            ]
            for s, _ in errors:
                self.router.set_healthy(s.url, False)
            old, self.weights_path, self.version = self.weights_path, path, version
            if old is not None and old != path and old.is_relative_to(self._root):
                shutil.rmtree(old, ignore_errors=True)
            pauses = {
                s.url: float(r)
                for s, r in zip(servers, results, strict=True)
                if isinstance(r, float)
            }
            report = SyncReport(version, time.monotonic() - t0, write_s, pauses, size)
            if not servers:
                return report, "no server was in rotation"
            if len(errors) == len(servers):
                return report, f"{errors[0][0].url}: {errors[0][1]!r}"
            return report, None

    async def _guarded(self, s: ServerState, coro: Any) -> float:
        """Runs one server's sync; gives up on it once it is taken out of rotation.

        A server that hangs mid-sync fails its health checks and is taken out (and
        restarted by a fleet); waiting for its control call's timeout would hold every
        push (and the lock a recovery needs) for that long.
        """
        task = asyncio.ensure_future(coro)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    return float(task.result())
                if not s.healthy:
                    raise LLMError(f"{s.url} was taken out of rotation during the weight sync")
        finally:
            if not task.done():
                task.cancel()
                _, pending = await asyncio.wait({task}, timeout=5.0)  # its finally: /resume
                for t in pending:
                    t.cancel()

    async def load_current(self, server: ServerState) -> None:
        """Brings one (restarted) server to the current weights and version."""
        async with self._lock:  # not halfway through a push
            await self._load_current(server)

    async def _load_current(self, server: ServerState) -> None:
        if self.weights_path is not None:
            await self._sync_one(server, self.weights_path, self.version, "abort")
        else:
            async with control_client(self.timeout_s, self.router) as http:
                await self._post(
                    http, server, "/update_weight_version", {"new_version": str(self.version)}
                )
            server.weight_version = self.version

    async def load_current_all(self) -> None:
        """Brings every server to the current weights and version (after launch)."""
        await asyncio.gather(*(self.load_current(s) for s in self.router.servers))

    async def _post(
        self,
        http: httpx.AsyncClient,
        s: ServerState,
        path: str,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        r = await http.post(f"{s.url}{path}", json=body, params=params)
        if r.status_code >= 300:
            raise LLMError(f"{s.url}{path}: HTTP {r.status_code}: {r.text[:300]}")
        return r

    async def _sync_one(self, s: ServerState, path: Path, version: int, mode: PauseMode) -> float:
        """Pause → reload → reset cache → label → resume; returns the pause length.

        The pause is timed from sending ``/pause`` to ``/resume`` returning: the
        longest stall an in-flight request can see.
        """
        async with control_client(self.timeout_s, self.router) as http:
            paused = time.monotonic()
            await self._post(http, s, "/pause", params={"mode": mode})
            try:
                await self._post(
                    http, s, "/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
                )  # fmt: skip
                await self._post(
                    http, s, "/reset_prefix_cache", params={"reset_running_requests": "true"}
                )
                await self._post(http, s, "/update_weight_version", {"new_version": str(version)})
                s.weight_version = version
            finally:
                await self._post(http, s, "/resume")
            return time.monotonic() - paused


class NcclWeightSync:
    """Pushes weights GPU-to-GPU with vLLM's NCCL weight-transfer engine (GPU path).

    One trainer rank (the sender) and every server's workers join one NCCL group;
    each :meth:`push` pauses the servers, broadcasts the module's parameters,
    bumps the version and resumes. Needs CUDA and servers started on GPUs.

    Args:
        router: The router whose servers get the weights.
        module: The trainer's model (its parameters are what gets sent).
        master_address: Address of the NCCL rendezvous (this host).
        master_port: Free port for the rendezvous.
        mode: Default pause mode.
    """

    def __init__(
        self,
        router: Router,
        module: Any,
        *,
        master_address: str = "127.0.0.1",
        master_port: int = 29555,
        mode: PauseMode = "keep",
    ) -> None:
        self.router = router
        self.module = module
        self.mode: PauseMode = mode
        self.master_address = master_address
        self.master_port = master_port
        self.version = max((s.weight_version for s in router.servers), default=0)
        self._engines: list[Any] = []

    def connect(self) -> None:
        """Rendezvous with every server's workers (blocking; call once)."""
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        for i, s in enumerate(self.router.servers):
            r = httpx.get(f"{s.url}/get_world_size", timeout=30, headers=self.router.headers)
            world = 1 + int(r.json()["world_size"])
            info = NCCLTrainerInitInfo(
                rank=0, master_address=self.master_address,
                master_port=self.master_port + i, world_size=world,
            )  # fmt: skip
            self._engines.append(
                NCCLTrainerWeightTransferEngine.trainer_init(
                    info,
                    client=_keyed(HTTPVLLMWeightSyncClient(s.url), self.router.headers),
                    source=ModuleSource(self.module),
                )
            )

    async def push(self, *, mode: PauseMode | None = None) -> SyncReport:
        """Broadcasts the module's current parameters to every server."""
        if not self._engines:
            await asyncio.to_thread(self.connect)
        t0 = time.monotonic()
        version = self.version + 1
        pauses: dict[str, float] = {}
        async with control_client(300, self.router) as http:
            for s, engine in zip(self.router.servers, self._engines, strict=True):
                (
                    await http.post(f"{s.url}/pause", params={"mode": mode or self.mode})
                ).raise_for_status()
                paused = time.monotonic()
                try:
                    await asyncio.to_thread(engine.send_weights)
                    await http.post(
                        f"{s.url}/reset_prefix_cache", params={"reset_running_requests": "true"}
                    )
                    await http.post(
                        f"{s.url}/update_weight_version", json={"new_version": str(version)}
                    )
                    s.weight_version = version
                finally:
                    await http.post(f"{s.url}/resume")
                pauses[s.url] = time.monotonic() - paused
        self.version = version
        return SyncReport(version, time.monotonic() - t0, 0.0, pauses)

    def close(self) -> None:
        """Shuts the NCCL groups down (idempotent)."""
        for e in self._engines:
            e.shutdown()
        self._engines.clear()
