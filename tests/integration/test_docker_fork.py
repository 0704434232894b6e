"""DockerSandbox.fork against the real engine: files copied and diverging, the child's
hardening equal to the parent's, and failed forks leaving no container or volume."""

from __future__ import annotations

import uuid

import pytest

from agentrl.sandbox.base import SandboxError, fork_sandbox
from agentrl.sandbox.docker import DockerSandbox
from agentrl.sandbox.docker_fork import FORK_LABEL
from agentrl.sandbox.images import docker_client
from tests.integration import docker_fixtures
from tests.integration.docker_fixtures import LIMITS

docker_image = docker_fixtures.docker_image  # the session fixture, under its own name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HARDENING = (
    "NetworkMode", "CapDrop", "SecurityOpt", "ReadonlyRootfs", "Memory", "MemorySwap",
    "NanoCpus", "PidsLimit", "Ulimits", "ShmSize", "Init",
)  # fmt: skip
SETUP = (
    "mkdir -p src/pkg && printf 'x = 1\\n' > src/pkg/mod.py && printf '#!/bin/sh\\necho hi\\n'"
    " > run.sh && chmod 750 run.sh && touch -d 2001-02-03 src/pkg/mod.py && ln -s src/pkg l"
    " && ln run.sh hard.sh && mkfifo fifo && echo t > /tmp/t.txt && echo s > /dev/shm/s.txt"
)
SHOW = (
    "stat -c '%n %a %u %Y %h' run.sh src/pkg/mod.py; readlink l; cat l/mod.py /tmp/t.txt "
    "/dev/shm/s.txt; test -p fifo && echo fifo"
)


def _left(run: str) -> tuple[list[str], list[str]]:
    client = docker_client()
    filters = {"label": [f"agentrl.run={run}"]}
    containers = [c.id for c in client.containers.list(all=True, filters=filters)]
    return containers, [v.name for v in client.volumes.list(filters=filters)]


async def test_fork_copies_files_keeps_hardening_and_diverges(docker_image: str) -> None:
    run = f"fork-{uuid.uuid4().hex[:8]}"
    client = docker_client()
    async with DockerSandbox(docker_image, LIMITS, run_id=run) as parent:
        assert (await parent.exec(SETUP)).ok
        before = await parent.exec(SHOW)
        child = await fork_sandbox(parent)
        assert isinstance(child, DockerSandbox)
        async with child:
            after = await child.exec(SHOW)
            assert after.ok and after.stdout == before.stdout, (before, after)
            assert "run.sh 750 1000" in after.stdout and "fifo" in after.stdout
            c, p = (client.containers.get(x.container_id) for x in (child, parent))
            assert c.id != p.id and c.labels[FORK_LABEL] == p.id
            assert c.labels["agentrl.run"] == run and c.image.id == p.image.id
            for key in HARDENING:
                assert c.attrs["HostConfig"][key] == p.attrs["HostConfig"][key], key
            assert c.attrs["Config"]["User"] == p.attrs["Config"]["User"]
            # Inside: the sandbox user, and no network but loopback.
            r = await child.exec("id -u; ls /sys/class/net")
            assert r.stdout.split() == ["1000", "lo"]
            r = await child.run_code(
                "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
                "    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)"
            )
            assert r.stdout.startswith("refused"), r.stdout
            # From here on the two diverge, both ways.
            await child.write_file("src/pkg/mod.py", "x = 2\n")
            await parent.write_file("only_parent.txt", "p")
            assert await parent.read_file("src/pkg/mod.py") == b"x = 1\n"
            assert await child.read_file("src/pkg/mod.py") == b"x = 2\n"
            assert not (await child.exec("test -e only_parent.txt")).ok
        assert await parent.read_file("l/mod.py") == b"x = 1\n"  # the parent outlives it
    assert _left(run) == ([], [])


async def test_failed_forks_raise_and_leave_nothing(docker_image: str) -> None:
    run = f"fork-fail-{uuid.uuid4().hex[:8]}"
    parent = DockerSandbox(docker_image, LIMITS, run_id=run)
    with pytest.raises(SandboxError, match="not started"):
        await parent.fork()
    async with parent:
        # The copy runs with the sandbox user's rights: a file it made unreadable fails it.
        assert (await parent.exec("echo secret > locked && chmod 000 locked")).ok
        with pytest.raises(SandboxError, match=r"archiving the parent's files.*locked"):
            await parent.fork()
        containers, volumes = _left(run)
        assert containers == [parent.container_id] and len(volumes) == 2
        volumes = sorted(volumes)
        assert (await parent.exec("chmod 600 locked && cat locked")).stdout == "secret\n"
        # The engine refuses the child's container (an image gone meanwhile).
        parent.image = "agentrl/no-such-image:fork-test"
        with pytest.raises(SandboxError, match="could not start a container"):
            await parent.fork()
        containers, left_volumes = _left(run)
        assert containers == [parent.container_id] and sorted(left_volumes) == volumes
    with pytest.raises(SandboxError, match="already closed"):
        await parent.fork()
    assert _left(run) == ([], [])
