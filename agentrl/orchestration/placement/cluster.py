"""Placing a run's components on a Ray cluster.

:meth:`RayDeployment.start` creates one placement group per role (see
:class:`~agentrl.config.ray.RayConfig`), starts the inference replicas
and the trainer workers in them, then the rollout workers over the replicas' URLs.
The driver process keeps a :class:`~agentrl.inference.fleet.Fleet` attached to the
replicas for health checks, evaluation and weight syncs; the Driver runs unchanged
over the adapters of :mod:`agentrl.orchestration.placement.adapters`
(``deployment.runner``, ``deployment.trainer``, ``deployment.sync``).
:meth:`RayDeployment.sync` writes the new weights once on every node that has a
replica (from the object store), then the Fleet pauses, reloads and resumes the servers.
A :class:`~agentrl.orchestration.placement.replicas.ReplicaSupervisor` retires a replica
whose actor died (its node was lost) and starts a new one when capacity returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from agentrl.config.ray import RayConfig, RoleSpec
from agentrl.orchestration.placement.actors import InferenceReplica, RolloutWorker, TrainerWorker
from agentrl.orchestration.placement.adapters import (
    RayRolloutRunner,
    RayTrainer,
    WeightsRef,
    await_refs,
)
from agentrl.orchestration.placement.ray_replicas import RayReplicas, actor_options
from agentrl.orchestration.placement.replicas import Replica, ReplicaSupervisor
from agentrl.runtime.lifecycle import AsyncClosing

__all__ = ["PlacementError", "RayDeployment", "connect", "create_placement_group"]


class PlacementError(RuntimeError):
    """The cluster could not grant a role's placement group; the message says what is missing."""


def connect(cfg: RayConfig) -> bool:
    """Joins the cluster at ``cfg.address`` unless Ray is already initialized.

    ``"local"`` starts a Ray instance of its own, even where another Ray cluster runs on
    this machine (a bare ``ray.init()`` would join that one). Returns whether this call
    initialized Ray (then the caller shuts it down).
    """
    if ray.is_initialized():
        return False
    if cfg.address is None:
        raise ValueError("RayConfig.address is None: not running on Ray")
    kwargs: dict[str, Any] = {"namespace": cfg.namespace, "log_to_driver": True}
    if cfg.address == "local":
        if cfg.object_store_memory:
            kwargs["object_store_memory"] = cfg.object_store_memory
        ray.init(address="local", **kwargs)
    else:
        ray.init(address=cfg.address, **kwargs)
    return True


def create_placement_group(role: str, spec: RoleSpec, timeout_s: float) -> PlacementGroup:
    """One bundle per actor of ``role``; waits until the cluster grants it.

    Raises:
        PlacementError: Not granted within ``timeout_s`` (the message shows what the
            bundles ask for and what the cluster has).
    """
    bundles = [spec.bundle() for _ in range(spec.count)]
    pg = placement_group(
        bundles, strategy=spec.strategy, name=f"agentrl-{role}-{uuid.uuid4().hex[:6]}"
    )
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(
            f"Ray could not place the {role} role within {timeout_s:.0f}s: it needs "
            f"{spec.count} × {bundles[0]} ({spec.strategy}), the cluster has "
            f"{ray.cluster_resources()} in total and {ray.available_resources()} free. "
            f"Start nodes with these resources (ray start --resources '...') or change "
            f"ray.{role} in the config"
        )
    return pg


@dataclass
class RayDeployment(AsyncClosing):
    """Everything a run placed on the cluster, with the node each actor runs on."""

    config: RayConfig
    placement_groups: dict[str, PlacementGroup]
    replicas: list[Any]
    rollout_workers: list[Any]
    trainer_workers: list[Any]
    fleet: Any
    runner: RayRolloutRunner
    trainer: RayTrainer
    supervisor: ReplicaSupervisor
    backend: RayReplicas
    nodes: dict[str, list[str]] = field(default_factory=dict)
    weights_root: str = ""
    _closed: bool = False

    @property
    def urls(self) -> list[str]:
        return list(self.fleet.urls)

    @classmethod
    async def start(
        cls,
        config: RayConfig,
        *,
        server: Any,
        trainer_config: Any,
        model_dir: str,
        env_spec: str,
        env_kwargs: Mapping[str, Any],
        loop_config: Any,
        group_size: int,
        max_concurrency: int,
        request_timeout_s: float = 600.0,
    ) -> RayDeployment:
        """Places and starts every actor; on failure removes whatever started.

        Args:
            config: Roles, resources, strategies, timeouts.
            server: The :class:`~agentrl.inference.server.ServerConfig` of each replica.
            trainer_config: The :class:`~agentrl.trainer.TrainerConfig`.
            model_dir: Model directory, at the same path on every node.
            env_spec: ``--env`` spec (a relative ``file.py:Class`` is made absolute here).
            env_kwargs: Keyword arguments of the env class.
            loop_config: The :class:`~agentrl.rollout.LoopConfig`.
            group_size: Episodes per task.
            max_concurrency: Most episodes in flight per rollout worker.
            request_timeout_s: Timeout of one generate call.
        """
        from agentrl.inference.fleet import Fleet

        env_spec, weights_root = _absolute_spec(env_spec), _weights_root()
        pgs: dict[str, PlacementGroup] = {}
        actors: list[Any] = []
        timeout = config.call_timeout_s
        try:
            for role in ("inference", "trainer", "rollout"):
                spec: RoleSpec = getattr(config, role)
                pgs[role] = await asyncio.to_thread(
                    create_placement_group, role, spec, config.placement_timeout_s
                )
            inf, tr, ro = config.inference, config.trainer, config.rollout
            replica_cls: Any = ray.remote(InferenceReplica)
            replicas = [
                replica_cls.options(**actor_options(inf, pgs["inference"], i)).remote(
                    server, weights_root
                )
                for i in range(inf.count)
            ]
            trainer_cls: Any = ray.remote(TrainerWorker)
            trainers = [
                trainer_cls.options(**actor_options(tr, pgs["trainer"], r)).remote(
                    trainer_config, model_dir, r, tr.count
                )
                for r in range(tr.count)
            ]
            actors += replicas + trainers
            addr = await await_refs(trainers[0].address.remote(), timeout)
            started = [r.start.remote() for r in replicas]
            setups = [t.setup.remote(*addr) for t in trainers]
            startup = float(getattr(server, "startup_timeout_s", timeout)) + 60.0
            urls, trainer_nodes = await asyncio.gather(
                await_refs(started, startup), await_refs(setups, timeout)
            )
            key = await await_refs(replicas[0].api_key.remote(), timeout)  # the run's, shared
            worker_cls: Any = ray.remote(RolloutWorker)
            workers = [
                worker_cls.options(**actor_options(ro, pgs["rollout"], i)).remote(
                    urls,
                    model_dir,
                    env_spec,
                    dict(env_kwargs),
                    loop_config,
                    group_size=group_size,
                    max_concurrency=max_concurrency,
                    request_timeout_s=request_timeout_s,
                    api_key=key,
                )
                for i in range(ro.count)
            ]
            actors += workers
            replica_info, worker_info = await asyncio.gather(
                await_refs([r.info.remote() for r in replicas], timeout),
                await_refs([w.info.remote() for w in workers], timeout),
            )
            fleet = await Fleet.attach(
                urls,
                api="generate",
                api_key=key,
                router_kwargs={"client_kwargs": {"timeout_s": request_timeout_s}},
            )
            await fleet.weight_sync.load_current_all()  # label the servers with version 0
        except BaseException:
            await asyncio.to_thread(_kill, actors, pgs)
            raise
        backend = RayReplicas(
            pgs["inference"], inf, server, weights_root, workers,
            call_timeout_s=timeout, start_timeout_s=startup,
        )  # fmt: skip
        supervisor = ReplicaSupervisor(
            fleet,
            backend,
            [
                Replica(i, r, str(u), str(info["node_id"]))
                for i, (r, u, info) in enumerate(zip(replicas, urls, replica_info, strict=True))
            ],
            interval_s=config.replica_check_interval_s,
        )
        supervisor.start()
        return cls(
            config=config,
            placement_groups=pgs,
            replicas=replicas,
            rollout_workers=workers,
            trainer_workers=trainers,
            fleet=fleet,
            runner=RayRolloutRunner(workers, group_size, timeout, config.max_group_retries),
            trainer=RayTrainer(trainers, timeout),
            nodes={
                "inference": [i["node_id"] for i in replica_info],
                "rollout": [i["node_id"] for i in worker_info],
                "trainer": list(trainer_nodes),
            },
            weights_root=weights_root,
            supervisor=supervisor,
            backend=backend,
        )

    async def sync(self, weights: Mapping[str, Any], mode: str) -> int:
        """Pushes ``weights`` (a :class:`WeightsRef` or a state dict) to every replica.

        Each node with a replica writes the weights once into the same local path;
        then the Fleet pauses every server, reloads, bumps the version and resumes.
        Returns the new weight version.
        """
        ref = weights.ref if isinstance(weights, WeightsRef) else ray.put(dict(weights))
        version = int(self.fleet.weight_version) + 1
        async with self.supervisor.lock:  # a replica joining meanwhile gets these weights
            writers: dict[str, Replica] = {}
            for r in self.supervisor.replicas():
                writers.setdefault(r.node_id, r)  # one weight writer per node
            results = await asyncio.gather(
                *(
                    await_refs(
                        w.actor.write_weights.remote(ref, version), self.config.call_timeout_s
                    )
                    for w in writers.values()
                ),
                return_exceptions=True,
            )
            paths = [p for p in results if isinstance(p, str)]
            if not paths:  # a replica whose node was lost fails here; it is retired apart
                raise next((e for e in results if isinstance(e, BaseException)), None) or (
                    RuntimeError("no live inference replica to write the weights to")
                )
            self.backend.weights = (ref, version)
        report = await self.fleet.sync_weights(paths[0], mode=mode)
        return int(report.version)

    async def info(self) -> dict[str, Any]:
        """Live state of the replicas and rollout workers."""
        t = self.config.call_timeout_s
        reps, workers = await asyncio.gather(
            await_refs([r.actor.info.remote() for r in self.supervisor.replicas()], t),
            await_refs([w.info.remote() for w in self.rollout_workers], t),
        )
        return {"replicas": reps, "rollout_workers": workers}

    async def close(self) -> None:
        """Stops servers and workers, kills the actors, removes placement groups (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self.supervisor.close()
        with contextlib.suppress(Exception):
            await self.fleet.close()
        replicas = self.replicas + self.backend.actors
        stops = [w.close.remote() for w in self.rollout_workers]
        stops += [t.close.remote() for t in self.trainer_workers]
        stops += [r.stop.remote() for r in replicas]
        # Each on its own: an actor that died (its node was lost) must not cut the others short.
        await asyncio.gather(*(await_refs(s, 60.0) for s in stops), return_exceptions=True)
        actors = replicas + self.rollout_workers + self.trainer_workers
        await asyncio.to_thread(_kill, actors, self.placement_groups)


def _kill(actors: Sequence[Any], pgs: Mapping[str, PlacementGroup]) -> None:
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a, no_restart=True)
    for pg in pgs.values():
        with contextlib.suppress(Exception):
            remove_placement_group(pg)


def _weights_root() -> str:
    """A fresh directory name for pushed weights, the same on every node (shm when there)."""
    from agentrl.inference.weight_sync import shm_base

    return os.path.join(shm_base(), f"agentrl-ray-{uuid.uuid4().hex[:10]}")


def _absolute_spec(spec: str) -> str:
    """``path/file.py:Cls`` relative to this process's directory → an absolute path."""
    path, sep, name = spec.rpartition(":")
    if sep and path.endswith(".py") and not os.path.isabs(path) and os.path.isfile(path):
        return f"{os.path.abspath(path)}:{name}"
    return spec
