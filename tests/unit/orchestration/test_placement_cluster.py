"""connect(): which Ray instance a run joins."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.config.ray import RayConfig
from agentrl.orchestration.placement import cluster


@pytest.fixture
def inits(monkeypatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: calls.append(kw))
    return calls


def test_local_starts_an_instance_of_its_own_not_a_running_cluster(inits) -> None:
    # A bare ray.init() joins a cluster already running on the machine (RAY_ADDRESS or
    # /tmp/ray/ray_current_cluster); "local" must not.
    assert cluster.connect(RayConfig(address="local", namespace="n"))
    assert inits == [{"address": "local", "namespace": "n", "log_to_driver": True}]


def test_an_address_is_joined(inits) -> None:
    assert cluster.connect(RayConfig(address="auto", namespace="n"))
    assert inits == [{"address": "auto", "namespace": "n", "log_to_driver": True}]


def test_nothing_to_do_when_ray_is_up(monkeypatch) -> None:
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: True)
    assert not cluster.connect(RayConfig(address="local"))
