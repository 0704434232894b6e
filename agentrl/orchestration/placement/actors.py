"""The Ray actors of a distributed run: inference replicas, rollout workers, trainer workers.

They are plain classes here; :mod:`agentrl.orchestration.placement.cluster` wraps them with
``ray.remote`` and places them in placement groups. Everything they exchange is
picklable: task rows, :class:`~agentrl.types.Trajectory` dataclasses, state dicts
of CPU tensors (through Ray's object store).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from agentrl.types import Trajectory

__all__ = ["InferenceReplica", "RolloutWorker", "TrainerWorker", "node_id"]


def node_id() -> str:
    """Hex id of the Ray node this process runs on."""
    return str(ray.get_runtime_context().get_node_id())


class InferenceReplica:
    """One vLLM server on this actor's node (it dies with the actor: reaper parent).

    Args:
        server: The server's configuration; its host is replaced by the node's IP so
            other nodes can reach it, which makes the server require its ``api_key``.
        weights_root: Local directory (same path on every node) where pushed weights go.
    """

    def __init__(self, server: Any, weights_root: str) -> None:
        from agentrl.inference.server import VLLMServer

        ip = ray.util.get_node_ip_address()
        self._server = VLLMServer(dataclasses.replace(server, host=ip))
        self._weights_root = Path(weights_root)
        self._closed = False
        self._stopped: asyncio.Event | None = None
        from agentrl.runtime.watchdog import watch_path

        watch_path(self._weights_root)  # removed if this worker is killed (driver gone, OOM)

    async def start(self) -> str:
        """Starts the server, waits until it is ready; returns its URL."""
        await self._server.start()
        return self._server.url

    async def wait_stopped(self) -> None:
        """Returns once :meth:`stop` ran; a caller whose call fails with
        ``ray.exceptions.RayActorError`` instead learns that this actor died."""
        if self._stopped is None:
            self._stopped = asyncio.Event()
        if not self._closed:
            await self._stopped.wait()

    def api_key(self) -> str | None:
        """The key the server requires (None: it listens on loopback only)."""
        return self._server.api_key

    def info(self) -> dict[str, Any]:
        """URL, node id, pid and log path of the server."""
        return {
            "url": self._server.url,
            "node_id": node_id(),
            "pid": self._server.pid,
            "log": str(self._server.log_path),
            "alive": self._server.is_alive(),
        }

    def write_weights(self, weights: Mapping[str, Any], version: int) -> str:
        """Writes ``weights`` as safetensors into ``weights_root/v<version>`` on this node.

        Atomic (temp dir, then rename), so replicas sharing a node (or a filesystem)
        may all write; the first rename wins. Versions older than the previous one
        are deleted. Returns the directory.
        """
        from agentrl.inference.weight_sync import write_safetensors

        final = self._weights_root / f"v{version}"
        if not (final / "model.safetensors").is_file():
            tmp = self._weights_root / f".v{version}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            write_safetensors(weights, tmp)
            try:
                tmp.rename(final)
            except OSError:  # another replica on this node got there first
                shutil.rmtree(tmp, ignore_errors=True)
        for old in self._weights_root.glob("v*"):
            with contextlib.suppress(ValueError):
                if int(old.name[1:]) < version - 1:
                    shutil.rmtree(old, ignore_errors=True)
        return str(final)

    async def stop(self) -> None:
        """Stops the server and deletes the weight files (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._server.stop()
            shutil.rmtree(self._weights_root, ignore_errors=True)
        finally:
            if self._stopped is not None:
                self._stopped.set()


class RolloutWorker:
    """Runs groups of episodes against the replicas; many groups at once (async actor).

    Args:
        urls: Inference server URLs.
        model_dir: Model directory (for the tokenizer), readable on this node.
        env_spec: ``--env`` spec, resolved here with :func:`agentrl.loading.envs.resolve_env`.
        env_kwargs: Keyword arguments of the env class.
        loop_config: The :class:`~agentrl.rollout.LoopConfig` of every episode.
        group_size: Episodes per task.
        max_concurrency: Most episodes in flight in this worker.
        request_timeout_s: Timeout of one generate call.
        health_interval_s: Seconds between checks that bring failed servers back.
        api_key: Bearer key of the servers (None: open servers).
    """

    def __init__(
        self,
        urls: Sequence[str],
        model_dir: str,
        env_spec: str,
        env_kwargs: Mapping[str, Any],
        loop_config: Any,
        *,
        group_size: int,
        max_concurrency: int,
        request_timeout_s: float = 600.0,
        health_interval_s: float = 2.0,
        api_key: str | None = None,
    ) -> None:
        from transformers import AutoTokenizer

        from agentrl.inference.router import Router
        from agentrl.loading.envs import resolve_env
        from agentrl.rollout import AgentLoop, RolloutRunner

        self._env_cls = resolve_env(env_spec)
        self._env_kwargs = dict(env_kwargs)
        self._shared: dict[str, Any] = {}  # what the env's run_resources yielded
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.router = Router(
            list(urls),
            api="generate",
            client_kwargs={"timeout_s": request_timeout_s},
            api_key=api_key,
        )
        self.runner = RolloutRunner(
            AgentLoop(self.router, tokenizer, loop_config),
            self._make_env,
            group_size=group_size,
            max_concurrency=max_concurrency,
        )
        self.health_interval_s = health_interval_s
        self.retired: set[str] = set()
        self.groups_done = 0
        self._health: asyncio.Task[None] | None = None
        self._resources = contextlib.AsyncExitStack()
        self._start_lock = asyncio.Lock()
        self._closed = False

    def _make_env(self) -> Any:
        return self._env_cls(**self._env_kwargs, **self._shared)

    async def start(self) -> None:
        """Opens the env's run resources and the health loop once (:meth:`run_group` calls it).

        Each worker enters ``env_cls.run_resources(**env_kwargs)`` itself (e.g. a pool of
        warm sandboxes on its own node) and exits it in :meth:`close`.

        Raises:
            ComponentError: The env's shared resources cannot start (named in the message).
        """
        from agentrl.orchestration.startup import open_env_resources

        async with self._start_lock:
            if self._closed:
                raise RuntimeError("this rollout worker is closed")
            if self._health is not None:  # started
                return
            self._shared = await open_env_resources(
                self._env_cls, self._env_kwargs, self._resources
            )
            self._health = asyncio.create_task(self._health_loop())

    async def _health_loop(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=5.0, headers=self.router.headers) as http:
            while not self._closed:
                for s in self.router.servers:
                    if s.healthy or s.url in self.retired:
                        continue
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{s.url}/health")).status_code == 200:
                            self.router.set_healthy(s.url, True)
                await asyncio.sleep(self.health_interval_s)

    def retire_server(self, url: str) -> None:
        """Takes a server that is gone for good (its replica died) out of the routing."""
        url = url.rstrip("/")
        self.retired.add(url)
        with contextlib.suppress(KeyError):
            self.router.set_healthy(url, False)

    def add_server(self, url: str) -> None:
        """Routes to a new server (it already holds the current weights)."""
        url = url.rstrip("/")
        self.retired.discard(url)
        try:
            self.router.set_healthy(url, True)
        except KeyError:
            self.router.add_server(url)
            self.router.set_healthy(url, True)  # wakes requests waiting for a server

    async def run_group(
        self, task: Mapping[str, Any], index: int, seed: int | None, tag: str
    ) -> list[Trajectory]:
        """Runs the G episodes of one task; see :meth:`RolloutRunner.run_group`."""
        await self.start()
        group = await self.runner.run_group(task, index=index, seed=seed, tag=tag)
        self.groups_done += 1
        return group

    def info(self) -> dict[str, Any]:
        """Node id, groups done and the router's counters."""
        return {"node_id": node_id(), "groups_done": self.groups_done, **self.router.metrics()}

    async def close(self) -> None:
        """Stops the health loop, the HTTP clients and the env's run resources (idempotent)."""
        if self._closed:
            return
        self._closed = True
        async with self._start_lock:  # a start in progress finishes first, then is undone
            if self._health is not None:
                self._health.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._health
            try:
                await self.router.close()
            finally:
                await self._resources.aclose()


class TrainerWorker:
    """One :class:`~agentrl.trainer.Trainer`; with ``world > 1``, one rank of an FSDP2 group.

    Args:
        config: The :class:`~agentrl.trainer.TrainerConfig`.
        model_dir: Model directory readable on this node.
        rank: This worker's rank.
        world: Number of trainer workers.
    """

    def __init__(self, config: Any, model_dir: str, rank: int = 0, world: int = 1) -> None:
        self.config = config
        self.model_dir = model_dir
        self.rank = rank
        self.world = world
        self.trainer: Any = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port (rank 0's is the rendezvous of the group)."""
        from agentrl.trainer.engine.distributed import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str = "127.0.0.1", master_port: int = 0) -> str:
        """Joins the process group (when ``world > 1``) and loads the model; returns the node id."""
        import torch

        if self.world > 1:
            import torch.distributed as dist

            os.environ.update(
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(master_port),
                RANK=str(self.rank),
                WORLD_SIZE=str(self.world),
                LOCAL_RANK="0",  # Ray gives each actor its own CUDA_VISIBLE_DEVICES
            )
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend, rank=self.rank, world_size=self.world)
        from agentrl.trainer import Trainer

        self.trainer = Trainer(self.config, self.model_dir)
        return node_id()

    def node_id(self) -> str:
        """Hex id of this worker's node."""
        return node_id()

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One training step; see :meth:`Trainer.step`."""
        return dict(self.trainer.step(trajectories))

    def state_dict_for_inference(self) -> dict[str, Any]:
        """Full policy weights on CPU (collective with ``world > 1``; {} off rank 0)."""
        return dict(self.trainer.state_dict_for_inference())

    def weights_checksum(self) -> str:
        """SHA-256 over this rank's parameter bytes (changes when the weights do)."""
        h = hashlib.sha256()
        for name, p in sorted(self.trainer.policy.state_dict().items()):
            h.update(name.encode())
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(t.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()

    def save_checkpoint(self, root: str | None = None, extra: dict[str, Any] | None = None) -> str:
        """Saves a checkpoint (on this node's filesystem); returns its directory."""
        return str(self.trainer.save_checkpoint(root, extra))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Resumes from a checkpoint; returns the caller's ``extra``."""
        return dict(self.trainer.load_checkpoint(path))

    def save_hf(self, out_dir: str) -> str:
        """Writes a plain HF model directory; returns it."""
        return str(self.trainer.save_hf(out_dir))

    def close(self) -> None:
        """Leaves the process group (idempotent)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
