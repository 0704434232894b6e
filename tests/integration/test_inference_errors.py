"""Bad input fails fast with one message naming the cause (real vLLM where it matters)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import time

import pytest

from agentrl.inference.fleet import Fleet
from agentrl.inference.server import ServerStartError, VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_missing_model_path(server_config, tmp_path):
    cfg = dataclasses.replace(server_config, model=str(tmp_path / "no-such-model"))
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="does not exist"):
        await Fleet.launch(cfg, num_servers=1)
    assert time.monotonic() - t0 < 5


async def test_tokenizer_without_chat_template(server_config, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(server_config.model, d)
    (d / "chat_template.jinja").unlink()
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(ServerStartError, match="no chat template"):
        await VLLMServer(dataclasses.replace(server_config, model=str(d))).start()


async def test_port_in_use(server_config):
    with socket.socket() as s:
        s.bind((server_config.host, 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerStartError, match=f"port {port} .*in use"):
            await VLLMServer(server_config, port).start()


async def test_model_vllm_cannot_load(server_config, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(server_config.model, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    cfg["model_type"] = "no_such_model_type"
    (d / "config.json").write_text(json.dumps(cfg))
    server = VLLMServer(dataclasses.replace(server_config, model=str(d)))
    with pytest.raises(ServerStartError, match=r"exited .* before it was ready") as e:
        await server.start()
    assert str(server.log_path) in str(e.value)  # it quotes the log
    assert not server.is_alive()


async def test_server_never_ready(server_config):
    server = VLLMServer(dataclasses.replace(server_config, startup_timeout_s=1.0))
    with pytest.raises(ServerStartError, match=r"(?s)not ready after 1s.*--- .*server-\d+\.log"):
        await server.start()
    assert not server.is_alive()  # stopped, not left behind
