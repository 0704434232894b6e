"""Adapter-only weight sync (``trainer.lora.serve: adapter``): hot-loading LoRA versions.

Each push writes only the adapters (peft format: ``adapter_config.json`` +
``adapter_model.safetensors``, megabytes instead of the whole model) into a new
directory per role and version under shared memory, ``<root>/<role>-v<version>/``, then
on every server at once: ``POST /v1/load_lora_adapter {"lora_name": "<role>-v<version>",
"lora_path": <dir>}`` → ``/update_weight_version``. There is no pause: requests in flight
finish on the adapter they were sent with, new ones are sent with the new name (the
:class:`~agentrl.inference.adapters.AdapterTable` the router reads), and every token is
labelled with the version of the adapter its request used, so the labels are exact by
construction (the ``mode`` of a push is accepted and not needed). An old version is
unloaded (``/v1/unload_lora_adapter``) as soon as no request in flight uses it on that
server, so the server's adapter slots (``--max-loras``) do not run out; its directory is
removed once no server holds it. Before the first push, requests use the base model
(version 0), which is what a fresh adapter (B = 0) computes.

Example (needs servers started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, which :class:`~agentrl.inference.fleet.Fleet`
does with ``ServerConfig(lora_max_rank=16)``)::

    sync = AdapterSync(router, table)
    report = await sync.push({"policy": "/path/to/peft_adapter_dir"})  # or a PeftModel
    sync.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from agentrl.inference.adapters import DEFAULT_ROLE, Adapter, AdapterTable
from agentrl.inference.protocol import LLMError
from agentrl.inference.router import Router, ServerState
from agentrl.inference.weight_sync import (
    PauseMode,
    SyncReport,
    await_recovery,
    control_client,
    new_weights_dir,
    remove_weights_dir,
)

__all__ = ["AdapterRefused", "AdapterSync", "write_adapter"]

log = logging.getLogger(__name__)

_FILES = ("adapter_config.json", "adapter_model.safetensors")
_MERGED = "or set trainer.lora.serve: merged"


class AdapterRefused(LLMError):
    """A server refused an adapter (resending will not help); the message names the setting."""


def write_adapter(source: Any, directory: Path) -> int:
    """Writes one adapter in peft format into ``directory`` (new); returns its size in bytes.

    Args:
        source: A peft adapter directory (its two files are hard-linked, or copied
            across file systems), or a ``peft.PeftModel`` (saved with ``save_pretrained``).
    """
    directory.mkdir(parents=True, exist_ok=False)
    if isinstance(source, str | Path):
        src = Path(source)
        for f in _FILES:
            if not (src / f).is_file():
                raise LLMError(f"{src} is not a peft adapter directory: it has no {f}")
            try:
                os.link(src / f, directory / f)
            except OSError:
                shutil.copyfile(src / f, directory / f)
    elif hasattr(source, "save_pretrained"):
        source.save_pretrained(str(directory), safe_serialization=True)
    else:
        raise TypeError(f"an adapter is a peft adapter directory or a PeftModel, not {source!r}")
    return sum((directory / f).stat().st_size for f in _FILES if (directory / f).exists())


def _adapter_rank(path: Path) -> int | None:
    try:
        return int(json.loads((path / "adapter_config.json").read_text())["r"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def refusal(url: str, adapter: Adapter, status: int, text: str) -> AdapterRefused:
    """The error for a server that answered ``status`` / ``text`` to loading ``adapter``."""
    where = f"{url} cannot load LoRA adapter {adapter.name!r} from {adapter.path}"
    if status == 404 and "load_lora_adapter" not in text and "adapter" not in text.lower():
        return AdapterRefused(
            f"{where}: the server has no /v1/load_lora_adapter route (HTTP 404). Start it "
            "with --enable-lora --max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, "
            + _MERGED
        )
    if "is greater than max_lora_rank" in text or "max_lora_rank" in text:
        rank = _adapter_rank(adapter.path)
        return AdapterRefused(
            f"{where}: trainer.lora.rank={rank} is above the server's --max-lora-rank. "
            f"Restart the server with a larger --max-lora-rank, lower trainer.lora.rank, "
            f"{_MERGED} (server said: {text[:300]})"
        )
    if "LoRA is not enabled" in text or "--enable-lora" in text:
        return AdapterRefused(
            f"{where}: the server was started without --enable-lora. Start it with "
            f"--enable-lora --max-lora-rank R, {_MERGED}"
        )
    return AdapterRefused(
        f"{where}: HTTP {status}: {text[:400]}. Check trainer.lora (rank, target_modules: "
        f"vLLM serves adapters on the layers it supports for this model), {_MERGED}"
    )


class AdapterSync:
    """Pushes LoRA adapters to a fleet's servers as new versions (no pause).

    Same interface as :class:`~agentrl.inference.weight_sync.WeightSync`.

    Args:
        router: The router whose servers get the adapters; its ``adapters`` table is set
            to this sync's table.
        shm_dir: Where adapter directories go (default ``/dev/shm`` when it exists).
        timeout_s: Timeout of each control call.
        recover_timeout_s: When no server took a push (they failed, hung or were out of
            rotation, not refused it), how long :meth:`push` waits for one to recover
            with the new version before it fails.
    """

    def __init__(
        self,
        router: Router,
        *,
        shm_dir: str | None = None,
        timeout_s: float = 120.0,
        recover_timeout_s: float = 900.0,
    ) -> None:
        self.router = router
        self.table = AdapterTable(on_idle=self._schedule_unload)
        router.adapters = self.table
        self.timeout_s = timeout_s
        self.recover_timeout_s = recover_timeout_s
        self._root = new_weights_dir("agentrl-adapters-", shm_dir)
        self.version = max((s.weight_version for s in router.servers), default=0)
        self.current: dict[str, Adapter] = {}
        """The newest adapter of each role (what a recovering server loads)."""
        self._lock = asyncio.Lock()
        self._unloads: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def weights_path(self) -> Path | None:
        """The directory of the newest policy adapter (None before the first push)."""
        a = self.current.get(DEFAULT_ROLE)
        return a.path if a is not None else None

    def close(self) -> None:
        """Stops pending unloads and deletes the adapter files (idempotent)."""
        self._closed = True
        for t in self._unloads:
            t.cancel()
        remove_weights_dir(self._root)

    async def push(
        self, weights: Any, *, mode: PauseMode | None = None, version: int | None = None
    ) -> SyncReport:
        """Loads new adapter versions into every healthy server.

        Args:
            weights: ``{role: adapter}`` (several roles at once), or one adapter for the
                ``policy`` role; an adapter is a peft directory or a ``peft.PeftModel``.
            mode: Not needed (requests in flight keep their adapter); accepted for the
                :class:`~agentrl.inference.weight_sync.WeightSync` interface.
            version: Label of the new adapters (default: the current version + 1).

        Returns:
            The :class:`SyncReport`: bytes written (the adapters), seconds, and in
            ``pause_s`` each server's load time (nothing is paused).

        Raises:
            AdapterRefused: Every server refused the adapter (rank above the server's
                ``--max-lora-rank``, LoRA not enabled, an adapter vLLM cannot serve).
            LLMError: No server took it otherwise, and none recovered with it in time.
        """
        del mode
        async with self._lock:
            report, errors, servers = await self._push_locked(weights, version)
        if not servers:
            await self._await_recovery(report.version, "no server was in rotation")
        elif len(errors) == len(servers):
            first = errors[0][1]
            if isinstance(first, AdapterRefused):
                raise first
            await self._await_recovery(report.version, f"{errors[0][0].url}: {first!r}")
        return report

    async def _push_locked(
        self, weights: Any, label: int | None
    ) -> tuple[SyncReport, list[tuple[ServerState, BaseException]], list[ServerState]]:
        t0 = time.monotonic()
        version = self.version + 1 if label is None else label
        items = weights.items() if isinstance(weights, Mapping) else [(DEFAULT_ROLE, weights)]
        new: list[Adapter] = []
        size = 0
        for role, source in items:
            a = Adapter(str(role), version, self._root / f"{role}-v{version}")
            if a.path.exists():  # the same label again (a start-up reload): a fresh path
                a = Adapter(a.role, a.version, self._root / f"{role}-v{version}-{time.time_ns()}")
            size += await asyncio.to_thread(write_adapter, source, a.path)
            new.append(a)
        write_s = time.monotonic() - t0
        servers = [s for s in self.router.servers if s.healthy]
        results = await asyncio.gather(
            *(self._load_all(s, new, version) for s in servers), return_exceptions=True
        )
        errors: list[tuple[ServerState, BaseException]] = [
            (s, r) for s, r in zip(servers, results, strict=True) if isinstance(r, BaseException)
        ]
        for s, e in errors:  # a refusal leaves the server serving its current adapters
            if not isinstance(e, AdapterRefused):
                self.router.set_healthy(s.url, False)
        old = self.current
        self.current = {**self.current, **{a.role: a for a in new}}
        self.version = version
        for a in old.values():
            self._drop_dir_if_unused(a)
        loads = {
            s.url: float(r) for s, r in zip(servers, results, strict=True) if isinstance(r, float)
        }
        return SyncReport(version, time.monotonic() - t0, write_s, loads, size), errors, servers

    async def _await_recovery(self, version: int, error: str) -> None:
        await await_recovery(
            self.router, version, self.recover_timeout_s, "adapter sync", error, new="adapters"
        )

    async def load_current(self, server: ServerState) -> None:
        """Brings one (restarted or rejoining) server to the current adapters and version."""
        async with self._lock:
            self.table.reset(server.url)  # a restarted server holds none; reload them
            await self._load_all(server, list(self.current.values()), self.version)

    async def load_current_all(self) -> None:
        """Brings every server to the current adapters and version (after launch)."""
        await asyncio.gather(*(self.load_current(s) for s in self.router.servers))

    async def _load_all(self, s: ServerState, adapters: list[Adapter], version: int) -> float:
        """Loads ``adapters`` into ``s``, makes them current, labels the server; returns
        the seconds it took."""
        t0 = time.monotonic()
        async with control_client(self.timeout_s, self.router) as http:
            for a in adapters:
                await self._load(http, s, a)
            for a in adapters:
                self.table.set_current(s.url, a)
            r = await http.post(
                f"{s.url}/update_weight_version", json={"new_version": str(version)}
            )
            if r.status_code >= 300:
                raise LLMError(
                    f"{s.url}/update_weight_version: HTTP {r.status_code}: {r.text[:300]}"
                )
            s.weight_version = version
        return time.monotonic() - t0

    async def _load(self, http: httpx.AsyncClient, s: ServerState, a: Adapter) -> None:
        body = {"lora_name": a.name, "lora_path": str(a.path)}
        r = await http.post(f"{s.url}/v1/load_lora_adapter", json=body)
        if r.status_code == 400 and "has already been loaded" in r.text:
            # A server we attached to kept this name from an earlier run: its prefix cache
            # may hold blocks of those weights, so unload it and drop the cache first.
            await http.post(f"{s.url}/v1/unload_lora_adapter", json={"lora_name": a.name})
            await http.post(f"{s.url}/reset_prefix_cache")
            r = await http.post(f"{s.url}/v1/load_lora_adapter", json=body)
        if r.status_code >= 300:
            raise refusal(s.url, a, r.status_code, r.text)

    def _schedule_unload(self, url: str, a: Adapter) -> None:
        if self._closed:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._unload(url, a))
        except RuntimeError:  # no loop (a test's table): the next push unloads it
            return
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)

    async def _unload(self, url: str, a: Adapter) -> None:
        """Unloads ``a`` from ``url`` (an idle old version); removes its directory once no
        server holds it. A failure is logged: the server restarts without it anyway."""
        try:
            async with control_client(self.timeout_s, self.router) as http:
                r = await http.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": a.name})
            if r.status_code < 300 or r.status_code == 404:
                self.table.forget(url, a.name)
            else:
                log.warning(
                    "unloading %s from %s: HTTP %s %s", a.name, url, r.status_code, r.text[:200]
                )
        except httpx.HTTPError as e:
            log.warning("unloading %s from %s: %r", a.name, url, e)
        self._drop_dir_if_unused(a)

    def _drop_dir_if_unused(self, a: Adapter) -> None:
        if not self.table.in_use(a) and all(c.name != a.name for c in self.current.values()):
            with contextlib.suppress(OSError):
                shutil.rmtree(a.path)

    async def settle(self, timeout_s: float = 30.0) -> None:
        """Waits for the pending unloads (tests; a run never needs to)."""
        deadline = time.monotonic() + timeout_s
        while self._unloads and time.monotonic() < deadline:
            await asyncio.wait(set(self._unloads), timeout=deadline - time.monotonic())
