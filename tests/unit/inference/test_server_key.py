"""The server key: the middleware's doors, who gets a key, and that every client sends it."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from agentrl.inference.auth import KEY_ENV, MIDDLEWARE, ServerKeyMiddleware, new_key
from agentrl.inference.client import BadRequest
from agentrl.inference.protocol import SamplingParams
from agentrl.inference.router import Router
from agentrl.inference.server import ServerConfig, VLLMServer
from agentrl.orchestration.startup import check_servers, detect_api
from agentrl.testing.scripted_server import RandomPolicy, ScriptedServer

KEY = "k" * 43


def _app() -> Starlette:
    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("inside")

    paths = ["/health", "/collective_rpc", "/pause", "/v1/completions", "/metrics"]
    return Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in paths])


@pytest.fixture
def http() -> TestClient:
    return TestClient(ServerKeyMiddleware(_app(), KEY))


@pytest.mark.parametrize("path", ["/collective_rpc", "/pause", "/v1/completions", "/metrics"])
def test_no_key_or_a_wrong_key_is_refused(http: TestClient, path: str) -> None:
    for headers in (
        {},
        {"Authorization": f"Bearer {KEY[:-1]}x"},  # one character off
        {"Authorization": f"Bearer {KEY}{KEY}"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": "Bearer "},
    ):
        r = http.post(path, headers=headers)
        assert r.status_code == 401, (path, headers)
        assert "inside" not in r.text
    assert http.post(path, headers={"Authorization": f"Bearer {KEY}"}).text == "inside"


def test_health_is_open_and_the_key_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    http = TestClient(ServerKeyMiddleware(_app()))  # as vLLM's --middleware builds it
    assert http.get("/health").text == "inside"
    assert http.post("/pause").status_code == 401
    assert http.post("/pause", headers={"Authorization": f"bearer {KEY}"}).text == "inside"


def test_a_middleware_without_a_key_refuses_to_start(monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(RuntimeError, match=KEY_ENV):
        ServerKeyMiddleware(_app())


def test_servers_off_loopback_get_the_key_in_their_environment_only(tmp_path) -> None:
    cfg = ServerConfig(model="m", host="10.1.2.3", log_dir=str(tmp_path), device="cpu")
    off = VLLMServer(cfg, port=1)
    assert off.api_key and len(off.api_key) >= 43
    cmd = off.command()
    assert cmd[cmd.index("--middleware") + 1] == MIDDLEWARE
    assert off.api_key not in " ".join(off.launch_command())
    assert off.environment()[KEY_ENV] == off.api_key
    assert off.api_key not in repr(cfg)
    shared = ServerConfig(model="m", host="0.0.0.0", api_key=KEY, log_dir=str(tmp_path))
    assert VLLMServer(shared, port=1).api_key == VLLMServer(shared, port=2).api_key == KEY


def test_loopback_servers_stay_open(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, "leaked-from-the-parent")
    for host in ("127.0.0.1", "localhost", "::1"):
        cfg = ServerConfig(model="m", host=host, api_key=KEY, log_dir=str(tmp_path), device="cpu")
        server = VLLMServer(cfg, port=1)
        assert server.api_key is None
        assert "--middleware" not in server.command()
        assert KEY_ENV not in server.environment()


async def test_router_metrics_and_startup_checks_send_the_key() -> None:
    key = new_key()
    with ScriptedServer(RandomPolicy(50, eos_id=49), api_key=key) as srv:
        params = SamplingParams(max_tokens=3, seed=1)
        async with Router([srv.url], client_kwargs={"retries": 0}) as open_router:
            with pytest.raises(BadRequest, match="401"):
                await open_router.generate([1, 2], params)
        async with Router([srv.url], api_key=key) as router:
            gen = await router.generate([1, 2], params)
            assert gen.token_ids
            async with httpx.AsyncClient(headers=router.headers) as http:
                assert (await http.get(f"{srv.url}/v1/models")).status_code == 200
        await check_servers([srv.url], api_key=key)
        assert await detect_api([srv.url], api_key=key) == "completions"
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{srv.url}/v1/models")).status_code == 401
            assert (await http.get(f"{srv.url}/health")).status_code == 200


def test_the_attached_servers_key_is_read_but_never_saved(tmp_path, monkeypatch) -> None:
    from agentrl.config import RunConfig, dump_config
    from agentrl.orchestration.startup import ATTACHED_KEY_ENV, attached_key

    monkeypatch.delenv(ATTACHED_KEY_ENV, raising=False)
    assert attached_key(RunConfig()) is None
    monkeypatch.setenv(ATTACHED_KEY_ENV, "from-env")
    assert attached_key(RunConfig()) == "from-env"
    cfg = RunConfig.model_validate({"inference": {"api_key": KEY, "urls": ["http://h:1"]}})
    assert attached_key(cfg) == KEY
    dump_config(cfg, tmp_path / "config.yaml")
    assert KEY not in (tmp_path / "config.yaml").read_text() and KEY not in repr(cfg)
