"""ReplicaSupervisor with doubles: a dead replica is a fleet "server down"; returned capacity
gets a new replica with the current weights; the trainer's lost node is named."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray.exceptions

from agentrl.inference.fleet import Fleet
from agentrl.inference.router import Router
from agentrl.orchestration.placement import node_loss
from agentrl.orchestration.placement.replicas import Replica, ReplicaSupervisor


class FakeFleet:
    def __init__(self, version: int = 3) -> None:
        self.weight_version = version
        self.rotation: dict[str, bool] = {}
        self.versions: dict[str, int] = {}

    def retire(self, url: str) -> None:
        self.rotation[url] = False

    async def add_server(self, url: str) -> None:
        self.versions[url] = self.weight_version  # loads the current weights, then joins
        self.rotation[url] = True


class FakeBackend:
    """Actors are names; ``die(index)`` ends a replica's watch as a Ray actor death does."""

    def __init__(self) -> None:
        self.deaths: dict[str, asyncio.Future[bool]] = {}
        self.capacity: set[int] = set()
        self.weights: tuple[str, int] | None = ("ref-v3", 3)
        self.on_node: dict[str, tuple[str, int]] = {}
        self.routed: list[tuple[str, bool]] = []
        self.killed: list[str] = []
        self.spawned = 0
        self.fail_load = False
        self.lock_held_while_loading: bool | None = None
        self.sup: ReplicaSupervisor | None = None

    def die(self, url: str) -> None:
        self.deaths[url].set_result(True)

    async def wait_dead(self, replica: Replica) -> bool:
        fut = self.deaths.setdefault(replica.url, asyncio.get_running_loop().create_future())
        return await fut

    async def placed(self, lost: Replica) -> bool:
        return lost.index in self.capacity

    async def spawn(self, index: int) -> Replica:
        self.spawned += 1
        return Replica(index, f"actor-{index}-{self.spawned}", f"http://new{self.spawned}",
                       f"node-new{self.spawned}")  # fmt: skip

    async def load_weights(self, replica: Replica) -> None:
        assert self.sup is not None
        self.lock_held_while_loading = self.sup.lock.locked()
        if self.fail_load:
            raise RuntimeError("disk full")
        if self.weights is not None:
            self.on_node[replica.node_id] = self.weights

    async def route(self, replica: Replica, up: bool) -> None:
        self.routed.append((replica.url, up))

    async def kill(self, replica: Replica) -> None:
        self.killed.append(replica.actor)


def _supervisor(fleet: FakeFleet, backend: FakeBackend) -> ReplicaSupervisor:
    replicas = [
        Replica(0, "actor-0", "http://a", "node-a"),
        Replica(1, "actor-1", "http://c", "node-c"),
    ]
    sup = ReplicaSupervisor(fleet, backend, replicas, interval_s=0.01)
    backend.sup = sup
    return sup


async def _until(pred: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_a_dead_replica_is_retired_from_the_fleet_and_the_rollout_workers() -> None:
    fleet, backend = FakeFleet(), FakeBackend()
    async with _supervisor(fleet, backend) as sup:
        sup.start()
        await _until(lambda: len(backend.deaths) == 2)
        backend.die("http://a")
        await _until(lambda: sup.events)
        assert fleet.rotation == {"http://a": False}
        assert backend.routed == [("http://a", False)]
        assert [r.url for r in sup.replicas()] == ["http://c"]
        assert sup.lost[0].node_id == "node-a"
        assert [(e.kind, e.index) for e in sup.events] == [("lost", 0)]
        await asyncio.sleep(0.05)
        assert backend.spawned == 0  # no capacity: nothing placed, the run goes on with C


async def test_returned_capacity_gets_a_new_replica_with_the_current_weights() -> None:
    fleet, backend = FakeFleet(version=3), FakeBackend()
    async with _supervisor(fleet, backend) as sup:
        sup.start()
        await _until(lambda: len(backend.deaths) == 2)
        backend.die("http://a")
        await _until(lambda: sup.lost)
        backend.capacity.add(0)  # Ray placed bundle 0 on a returned node
        await _until(lambda: [e for e in sup.events if e.kind == "added"])
        new = sup.live[0]
        assert new.url == "http://new1" and not sup.lost
        assert backend.on_node["node-new1"] == ("ref-v3", 3)  # the last push, on its node
        assert backend.lock_held_while_loading  # no push writes weights meanwhile
        assert fleet.versions["http://new1"] == 3 and fleet.rotation["http://new1"]
        assert ("http://new1", True) in backend.routed  # the rollout workers route to it
        # The new replica is watched in turn.
        await _until(lambda: "http://new1" in backend.deaths)
        backend.capacity.clear()
        backend.die("http://new1")
        await _until(lambda: 0 in sup.lost)
        assert fleet.rotation["http://new1"] is False


async def test_a_replica_that_cannot_join_is_killed_and_the_bundle_stays_lost() -> None:
    fleet, backend = FakeFleet(), FakeBackend()
    sup = _supervisor(fleet, backend)
    await sup.mark_lost(sup.live[0])
    backend.capacity.add(0)
    backend.fail_load = True
    with pytest.raises(RuntimeError, match="disk full"):
        await sup.readd(0)
    assert backend.killed == ["actor-0-1"] and 0 in sup.lost and 0 not in sup.live
    assert "http://new1" not in fleet.versions
    backend.fail_load = False
    assert (await sup.readd(0)) is not None and 0 in sup.live
    await sup.close()


class FakeSync:
    def __init__(self, router: Router, version: int) -> None:
        self.router, self.version = router, version
        self.loaded: list[tuple[str, bool]] = []

    async def load_current(self, state: Any) -> None:
        self.loaded.append((state.url, state.healthy))
        state.weight_version = self.version

    def close(self) -> None:
        pass


def _fleet(urls: list[str], version: int) -> Fleet:
    router = Router(urls, api="generate")
    fleet = Fleet(router, [None] * len(urls))
    fleet.weight_sync.close()  # its shared-memory directory
    fleet.weight_sync = FakeSync(router, version)  # type: ignore[assignment]
    return fleet


async def test_fleet_add_server_joins_only_with_the_current_weights() -> None:
    fleet = _fleet(["http://c:1"], version=5)
    await fleet.add_server("http://new:2")
    sync: Any = fleet.weight_sync
    assert sync.loaded == [("http://new:2", False)]  # out of rotation while it loads
    new = fleet.router.server("http://new:2")
    assert new.healthy and new.weight_version == 5
    assert len(fleet.servers) == len(fleet.router.servers) == 2
    await fleet.close()


async def test_a_retired_server_stays_out_though_its_url_answers_again() -> None:
    fleet = _fleet(["http://a:1", "http://c:1"], version=2)
    fleet.retire("http://a:1")
    ok = httpx.MockTransport(lambda req: httpx.Response(200))
    async with httpx.AsyncClient(transport=ok) as http:
        await fleet.check_health(http)
        await asyncio.sleep(0.01)
    assert not fleet.router.server("http://a:1").healthy  # no rejoin of a retired server
    assert fleet.router.server("http://c:1").healthy
    await fleet.add_server("http://a:1")  # a new replica at the same URL is taken back
    assert fleet.router.server("http://a:1").healthy and len(fleet.router.servers) == 2
    await fleet.close()


class DeadWorker:
    class node_id:  # stands for an actor method
        @staticmethod
        def remote() -> Any:
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            fut.set_exception(ray.exceptions.ActorDiedError())

            class Ref:
                def future(self) -> concurrent.futures.Future[Any]:
                    return fut

            return Ref()


async def test_the_trainer_lost_with_its_node_is_named_with_the_resume_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_loss, "_dead_nodes", lambda: {"b" * 56})
    cause = await node_loss.trainer_loss([DeadWorker()], ["b" * 56], timeout_s=1)
    assert cause == f"the Ray node holding the trainer (node {'b' * 12}) was lost"
    msg = node_loss.node_lost_message(cause, Path("runs/x"), "runs/x/ckpt", {"trainer": 1.0})
    assert "\n" not in msg and msg.endswith("continue with: agentrl train --resume runs/x")
    assert "runs/x/ckpt" in msg and "{'trainer': 1.0}" in msg
    monkeypatch.setattr(node_loss, "_dead_nodes", set)
    cause = await node_loss.trainer_loss([DeadWorker()], ["b" * 56], timeout_s=0.6)
    assert cause is not None and cause.startswith("trainer worker 0 died")


async def test_a_rollout_worker_stops_routing_to_a_retired_server_and_routes_to_a_new_one() -> None:
    from agentrl.orchestration.placement.actors import RolloutWorker

    w = RolloutWorker.__new__(RolloutWorker)  # the routing part alone (no tokenizer, no env)
    w.router, w.retired = Router(["http://a:1", "http://c:1"], api="generate"), set()
    w.retire_server("http://a:1")
    assert not w.router.server("http://a:1").healthy and w.retired == {"http://a:1"}
    w.add_server("http://new:2")
    assert w.router.server("http://new:2").healthy
    assert w.router.place("episode-1").url in {"http://c:1", "http://new:2"}
    await w.router.close()
