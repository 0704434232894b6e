"""reap_orphans and remove_docker on an engine where another process removes containers."""

from __future__ import annotations

import socket
from typing import Any

import docker
import docker.errors

from agentrl.runtime.watchdog import remove_docker
from agentrl.sandbox.docker_owner import reap_orphans


class _Container:
    def __init__(self, labels: dict[str, str], removed: list[str], name: str) -> None:
        self.labels, self._removed, self.name = labels, removed, name

    def remove(self, **_: Any) -> None:
        self._removed.append(self.name)


class _RacyEngine:
    """docker-py's client over an engine where ``gone`` was removed by someone else after
    the engine listed it: inspecting it raises NotFound unless ``ignore_removed``."""

    def __init__(self) -> None:
        dead = {"agentrl": "1", "agentrl.host": socket.gethostname(), "agentrl.pid": "x"}
        self.removed: list[str] = []
        self.live = [_Container(dead, self.removed, "orphan")]
        self.containers = self
        self.volumes = self

    def list(self, all: bool = False, filters: Any = None, ignore_removed: bool = False):
        if filters and "label" in filters and all and not ignore_removed:
            raise docker.errors.NotFound("No such container: gone")
        return list(self.live) if all else []

    def close(self) -> None:
        pass


def test_reap_orphans_skips_a_container_removed_meanwhile() -> None:
    engine = _RacyEngine()
    assert reap_orphans(engine) == 1
    assert engine.removed == ["orphan"]


def test_remove_docker_skips_a_container_removed_meanwhile(monkeypatch) -> None:
    engine = _RacyEngine()
    monkeypatch.setattr(docker, "from_env", lambda **_: engine)
    assert remove_docker({"agentrl.run": "r"}) == 1
    assert engine.removed == ["orphan"]
