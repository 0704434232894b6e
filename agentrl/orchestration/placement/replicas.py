"""Keeping the inference replicas of a Ray run: a lost one is a server down, returned
capacity gets a new one.

:class:`ReplicaSupervisor` holds one pending call per replica actor (``wait_stopped``);
when the actor dies (its node was lost, it was killed) the call fails at once and the
replica's server is retired from the fleet and from every rollout worker's routing: its
in-flight requests fail over to the other servers, nothing waits on it. Every
``ray.replica_check_interval_s`` the supervisor looks whether the lost replica's
placement bundle is placed again (Ray re-places the bundles of a lost node once a node
with the resources joins); then it starts a new replica in that bundle, writes the
current weights on its node, loads them (the fleet labels the server with the current
weight version) and adds the server to the fleet's and the rollout workers' routing.

The Ray calls live behind :class:`ReplicaBackend`
(:class:`~agentrl.orchestration.placement.ray_replicas.RayReplicas`), so the logic is
tested with doubles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.runtime.lifecycle import AsyncClosing

__all__ = ["Replica", "ReplicaBackend", "ReplicaEvent", "ReplicaSupervisor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replica:
    """One running inference replica: its placement bundle, actor, server URL and node."""

    index: int
    actor: Any
    url: str
    node_id: str


@dataclass(frozen=True)
class ReplicaEvent:
    """``lost`` (the actor died; its server was retired) or ``added`` (a new replica serves)."""

    kind: str
    index: int
    url: str
    node_id: str
    at: float  # time.monotonic()


class FleetLike(Protocol):
    """What the supervisor needs of :class:`~agentrl.inference.fleet.Fleet`."""

    def retire(self, url: str) -> None: ...

    async def add_server(self, url: str) -> None: ...


class ReplicaBackend(Protocol):
    """The cluster side: actors, placement bundles, weight files, rollout workers."""

    async def wait_dead(self, replica: Replica) -> bool:
        """Waits until the replica's actor ends: True when it died, False when it was stopped."""
        ...

    async def placed(self, lost: Replica) -> bool:
        """Whether the lost replica's bundle is placed again (on a live node)."""
        ...

    async def spawn(self, index: int) -> Replica:
        """Starts a replica in bundle ``index`` and waits until its server is ready."""
        ...

    async def load_weights(self, replica: Replica) -> None:
        """Writes the current weights on the replica's node (nothing before the first push)."""
        ...

    async def route(self, replica: Replica, up: bool) -> None:
        """Adds the replica's server to (``up``) or retires it from the rollout workers."""
        ...

    async def kill(self, replica: Replica) -> None:
        """Kills a replica that could not join."""
        ...


class ReplicaSupervisor(AsyncClosing):
    """Marks dead replicas down and places new ones where capacity returns.

    Args:
        fleet: The run's fleet (the driver's routing, evaluations and weight syncs).
        backend: The cluster side.
        replicas: The replicas started with the run.
        interval_s: Seconds between looks for returned capacity.
    """

    def __init__(
        self,
        fleet: FleetLike,
        backend: ReplicaBackend,
        replicas: Sequence[Replica],
        *,
        interval_s: float = 5.0,
    ) -> None:
        self.fleet = fleet
        self.backend = backend
        self.interval_s = interval_s
        self.live: dict[int, Replica] = {r.index: r for r in replicas}
        self.lost: dict[int, Replica] = {}
        self.events: list[ReplicaEvent] = []
        self.lock = asyncio.Lock()
        """Held while weights are written to the replicas' nodes (a push, or a new replica)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def start(self) -> None:
        """Watches every replica and starts looking for returned capacity."""
        for r in self.live.values():
            self._spawn_task(self._watch(r), f"replica-watch-{r.index}")
        self._spawn_task(self._readd_loop(), "replica-readd")

    def _spawn_task(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def replicas(self) -> list[Replica]:
        """The live replicas, bundle order."""
        return [self.live[i] for i in sorted(self.live)]

    async def _watch(self, r: Replica) -> None:
        try:
            died = await self.backend.wait_dead(r)
        except Exception as e:  # treat an unreadable watch as a death: never wait on it
            log.warning("lost the watch on inference replica %d: %r", r.index, e)
            died = True
        if died and not self._closed:
            await self.mark_lost(r)

    async def mark_lost(self, r: Replica) -> None:
        """Retires the replica's server everywhere; its bundle waits for capacity."""
        if self.live.get(r.index) is not r:
            return
        del self.live[r.index]
        self.lost[r.index] = r
        self.fleet.retire(r.url)
        self.events.append(ReplicaEvent("lost", r.index, r.url, r.node_id, time.monotonic()))
        log.warning(
            "inference replica %d (%s, node %s) died; its server is out of rotation",
            r.index, r.url, r.node_id[:12],
        )  # fmt: skip
        try:
            await self.backend.route(r, up=False)
        except Exception as e:  # a rollout worker gone too: its own failover covers it
            log.warning("could not retire %s from the rollout workers: %r", r.url, e)

    async def _readd_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.interval_s)
            for index in sorted(self.lost):
                try:
                    await self.readd(index)
                except Exception as e:  # try again at the next look
                    log.warning("could not re-add inference replica %d: %r", index, e)

    async def readd(self, index: int) -> Replica | None:
        """Places a new replica in the lost bundle ``index`` if capacity is back.

        Returns the new replica, or None while the bundle waits for a node.
        """
        lost = self.lost.get(index)
        if lost is None or not await self.backend.placed(lost):
            return None
        new = await self.backend.spawn(index)
        try:
            async with self.lock:  # no push writes weights meanwhile
                await self.backend.load_weights(new)
                self.live[index] = new  # later pushes write to its node too
            await self.fleet.add_server(new.url)  # loads the current weights and version
            await self.backend.route(new, up=True)
        except BaseException:
            self.live.pop(index, None)
            with contextlib.suppress(Exception):
                self.fleet.retire(new.url)
            await self.backend.kill(new)
            raise
        del self.lost[index]
        self.events.append(ReplicaEvent("added", index, new.url, new.node_id, time.monotonic()))
        log.warning("inference replica %d is back: %s on node %s", index, new.url, new.node_id[:12])
        if not self._closed:
            self._spawn_task(self._watch(new), f"replica-watch-{index}")
        return new

    async def close(self) -> None:
        """Stops watching and looking (idempotent); the actors are the deployment's to stop."""
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
