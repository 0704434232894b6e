"""Shared fixtures of the Docker sandbox tests: a running engine and the python image."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agentrl.sandbox.base import SandboxLimits

ROOT = Path(__file__).resolve().parents[2]
#: Small limits keep the suite quick on 2 shared cores.
LIMITS = SandboxLimits(
    wall_timeout_s=10,
    cpu_time_s=10,
    memory_mb=128,
    max_processes=32,
    max_file_size_mb=16,
    max_disk_mb=32,
    max_output_bytes=64 << 10,
)


def containers(labels: dict[str, str], *, check: bool = True) -> list[str]:
    """Ids of the sandbox containers, running or not, that carry all of ``labels`` (e.g.
    ``{"agentrl.pid": str(os.getpid())}``: this process's; other tests may run Docker too)."""
    filters = [f"label={k}={v}" for k, v in {"agentrl.sandbox": "1", **labels}.items()]
    r = subprocess.run(
        ["docker", "ps", "-aq", *(a for f in filters for a in ("--filter", f))],
        capture_output=True, text=True, timeout=30, check=check,
    )  # fmt: skip
    return r.stdout.split()


def _engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=10).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def docker_image() -> str:
    """Tag of ``agentrl/python``; starts the engine (scripts/setup-docker.sh) if needed."""
    pytest.importorskip("docker", reason="the `docker` Python SDK is not installed")
    if os.environ.get("AGENTRL_SKIP_DOCKER") == "1":
        pytest.skip("AGENTRL_SKIP_DOCKER=1")
    if not _engine_answers():
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts/setup-docker.sh")],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"no Docker engine, and setup-docker.sh failed:\n{proc.stderr[-3000:]}")
    from agentrl.sandbox.images import ensure_image

    return ensure_image("python")


def ps(text: str) -> list[str]:
    """Command lines from ``ps -eo args`` output, minus ps itself and the exec wrapper."""
    lines = [line.strip() for line in text.splitlines()[1:]]
    return [x for x in lines if x and "agentrl-exec" not in x and not x.endswith("ps -eo args")]
