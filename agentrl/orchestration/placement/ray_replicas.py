"""The Ray side of :class:`~agentrl.orchestration.placement.replicas.ReplicaSupervisor`:
replica actors in the inference placement group's bundles, their weight files, and the
rollout workers' routing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.config.ray import RoleSpec
from agentrl.orchestration.placement.actors import InferenceReplica
from agentrl.orchestration.placement.adapters import await_refs
from agentrl.orchestration.placement.replicas import Replica

__all__ = ["RayReplicas", "actor_options"]


def actor_options(spec: RoleSpec, pg: PlacementGroup, index: int) -> dict[str, Any]:
    """``.options(...)`` of an actor of ``spec``'s role in bundle ``index`` of ``pg``."""
    return {
        "num_cpus": spec.num_cpus,
        "num_gpus": spec.num_gpus,
        "resources": dict(spec.resources),
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=index
        ),
    }


class RayReplicas:
    """Starts, watches and feeds inference replica actors.

    Args:
        pg: The inference role's placement group (one bundle per replica).
        spec: The inference role.
        server: The :class:`~agentrl.inference.server.ServerConfig` of each replica.
        weights_root: Where replicas write pushed weights (same path on every node).
        rollout_workers: The rollout worker actors (their routers learn of new servers).
        call_timeout_s: Timeout of one remote call.
        start_timeout_s: Timeout of a replica's server start.
    """

    def __init__(
        self,
        pg: PlacementGroup,
        spec: RoleSpec,
        server: Any,
        weights_root: str,
        rollout_workers: Sequence[Any],
        *,
        call_timeout_s: float,
        start_timeout_s: float,
    ) -> None:
        self.pg = pg
        self.spec = spec
        self.server = server
        self.weights_root = weights_root
        self.rollout_workers = list(rollout_workers)
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.weights: tuple[Any, int] | None = None
        """The last pushed weights (object ref, version): what a new replica loads. Keeping
        the ref keeps one copy of the weights in the object store until the next push."""
        self.actors: list[Any] = []
        """Every replica actor started after the run's first ones (the deployment kills them)."""

    async def wait_dead(self, replica: Replica) -> bool:
        try:
            await asyncio.wrap_future(replica.actor.wait_stopped.remote().future())
        except ray.exceptions.RayActorError:
            return True
        return False

    async def placed(self, lost: Replica) -> bool:
        table = await asyncio.to_thread(placement_group_table, self.pg)
        node = (table.get("bundles_to_node_id") or {}).get(lost.index) or ""
        return bool(node) and node != lost.node_id

    async def spawn(self, index: int) -> Replica:
        cls: Any = ray.remote(InferenceReplica)
        actor = cls.options(**actor_options(self.spec, self.pg, index)).remote(
            self.server, self.weights_root
        )
        self.actors.append(actor)
        try:
            url = await await_refs(actor.start.remote(), self.start_timeout_s)
            info = await await_refs(actor.info.remote(), self.call_timeout_s)
        except BaseException:
            await asyncio.to_thread(ray.kill, actor, no_restart=True)
            raise
        return Replica(index, actor, str(url), str(info["node_id"]))

    async def load_weights(self, replica: Replica) -> None:
        if self.weights is not None:
            ref, version = self.weights
            await await_refs(replica.actor.write_weights.remote(ref, version), self.call_timeout_s)

    async def route(self, replica: Replica, up: bool) -> None:
        method = "add_server" if up else "retire_server"
        results = await asyncio.gather(
            *(
                await_refs(getattr(w, method).remote(replica.url), self.call_timeout_s)
                for w in self.rollout_workers
            ),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if len(errors) == len(results) and errors:
            raise errors[0]

    async def kill(self, replica: Replica) -> None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(ray.kill, replica.actor, no_restart=True)
