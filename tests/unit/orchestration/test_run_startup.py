"""Start-up checks of `agentrl train`: unreachable servers and sandboxes that cannot start."""

from __future__ import annotations

import socket

import pytest

from agentrl.envs.retool import RetoolEnv
from agentrl.orchestration.startup import (
    GENERATE_ROUTE,
    ComponentError,
    check_servers,
    detect_api,
    preflight_env,
)
from agentrl.sandbox.base import SandboxError
from agentrl.testing.scripted_server import RandomPolicy, ScriptedServer


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_server_is_named():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ComponentError, match=rf"cannot reach the inference servers.*{url}"):
        await check_servers([url], timeout_s=2)


async def test_reachable_server_passes():
    with ScriptedServer(RandomPolicy(10, eos_id=9)) as srv:
        assert await check_servers([srv.url]) == {}


async def test_a_run_starts_on_the_servers_that_answer_and_names_the_others():
    """One of two servers restarting as the run (re)starts: not a reason to refuse it."""
    url = f"http://127.0.0.1:{_closed_port()}"
    with ScriptedServer(RandomPolicy(10, eos_id=9)) as srv:
        down = await check_servers([srv.url, url], timeout_s=2)
    assert list(down) == [url] and "ConnectError" in down[url]


class OpenApiServer:
    """A real HTTP server whose /openapi.json lists ``paths``."""

    def __init__(self, paths):
        import http.server
        import json
        import threading

        body = json.dumps({"paths": {p: {} for p in paths}}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path == "/openapi.json"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", str(len(body) if ok else 0))
                self.end_headers()
                if ok:
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


async def test_detect_api_takes_the_token_route_only_where_every_server_has_it():
    with (
        OpenApiServer(["/v1/completions", GENERATE_ROUTE]) as vllm,
        OpenApiServer(["/v1/completions"]) as other,
        ScriptedServer(RandomPolicy(10, eos_id=9)) as scripted,
    ):
        assert await detect_api([vllm.url]) == "generate"
        assert await detect_api([vllm.url, vllm.url + "/"]) == "generate"
        assert await detect_api([vllm.url, other.url]) == "completions"
        assert await detect_api([scripted.url]) == "completions"
        down = f"http://127.0.0.1:{_closed_port()}"
        assert await detect_api([vllm.url, down], timeout_s=2) == "completions"


class BrokenSandbox:
    async def start(self):
        raise SandboxError("namespaces are not permitted here")

    async def close(self):
        pass


async def test_sandbox_that_cannot_start_fails_the_run_at_start_up():
    with pytest.raises(ComponentError, match=r"RetoolEnv cannot start: .*namespaces"):
        await preflight_env(RetoolEnv, {"sandbox_factory": BrokenSandbox})


async def test_working_sandbox_passes_preflight():
    await preflight_env(RetoolEnv, {})


def test_a_runs_kv_cache_setting_reaches_the_server_unrounded():
    from agentrl.config import load_config
    from agentrl.orchestration.startup import server_config

    cfg = load_config(None, ["inference.kv_cache_gb=0.5"])
    assert server_config(cfg, "/m", None).kv_cache_gib == 0.5


@pytest.mark.parametrize(
    ("declared", "configured", "want"),
    [
        (False, "auto", "outcome"),
        (True, "auto", "process"),
        (True, "outcome", "outcome"),
        (False, "process", "process"),
    ],
)
def test_auto_supervision_is_what_the_env_declares(declared, configured, want) -> None:
    from agentrl import Env
    from agentrl.config import RunConfig
    from agentrl.orchestration.startup import resolve_supervision

    class Declared(Env):
        process_rewards = declared

    cfg = RunConfig(trainer={"advantage": {"supervision": configured}})
    out = resolve_supervision(cfg, Declared)
    assert out.trainer.advantage.supervision == want
    assert cfg.trainer.advantage.supervision == configured  # the input is not changed


async def test_a_server_down_at_start_is_out_of_rotation_until_it_answers():
    from types import SimpleNamespace

    from agentrl.config import load_config
    from agentrl.orchestration.run import _open_fleet

    url = f"http://127.0.0.1:{_closed_port()}"
    said: list[str] = []
    with ScriptedServer(RandomPolicy(10, eos_id=9)) as srv:
        cfg = load_config(None, [f'inference.urls=["{srv.url}", "{url}"]', "model.path=tiny"])
        fleet = await _open_fleet(SimpleNamespace(cfg=cfg), num_servers=1, log_dir=None,
                                  say=said.append)  # fmt: skip
        try:
            assert [s.healthy for s in fleet.router.servers] == [True, False]
            assert len(said) == 1 and url in said[0] and "joins once it answers" in said[0]
        finally:
            await fleet.close()
