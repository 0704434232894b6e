"""Adapter-only weight sync (``trainer.lora.serve: adapter``) against an HTTP double of
vLLM's LoRA routes: a new name and directory per version, labels from the adapter a
request used, unloading once idle, and refusals that name the setting to change."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl.inference import lora_sync
from agentrl.inference.adapters import Adapter, AdapterTable, served_lora_rank
from agentrl.inference.lora_sync import AdapterRefused, AdapterSync
from agentrl.inference.protocol import Generation, SamplingParams
from agentrl.inference.router import Router
from agentrl.inference.server import ServerConfig, VLLMServer

URL = "http://127.0.0.1:1"


def _adapter_dir(tmp_path: Path, name: str = "a", rank: int = 8) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 16}))
    (d / "adapter_model.safetensors").write_bytes(b"x" * 1000)
    return d


class Vllm:
    """The LoRA control routes of one vLLM server; ``refuse`` answers every load."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.loaded: dict[str, str] = {}
        self.refuse: tuple[int, str] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        path = request.url.path
        self.calls.append((path, body))
        if path == "/v1/load_lora_adapter":
            if self.refuse:
                return httpx.Response(self.refuse[0], text=self.refuse[1])
            assert Path(body["lora_path"], "adapter_config.json").is_file()
            self.loaded[body["lora_name"]] = body["lora_path"]
        elif path == "/v1/unload_lora_adapter":
            self.loaded.pop(body["lora_name"])
        return httpx.Response(200, text="ok")


@pytest.fixture
def vllm(monkeypatch: pytest.MonkeyPatch) -> Vllm:
    server = Vllm()

    def client(timeout_s: float, router: Router) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(server), timeout=timeout_s)

    monkeypatch.setattr(lora_sync, "control_client", client)
    return server


class Held:
    """A server client whose requests wait for ``go``; records the model each was sent to."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.models: list[str | None] = []

    async def generate(
        self, prompt_ids: Any, params: Any, *, session_id: Any = None, **kw: Any
    ) -> Generation:
        self.models.append(kw.get("model"))
        await self.go.wait()
        v = kw.get("version", 0)
        return Generation([1, 2, 3], [-0.1] * 3, "length", [v] * 3)

    async def close(self) -> None:
        pass


def _router() -> tuple[Router, Held]:
    router = Router([URL])
    held = Held()
    router.servers[0].client = held  # type: ignore[assignment]
    return router, held


@pytest.mark.parametrize(("rank", "served"), [(1, 1), (4, 8), (16, 16), (17, 32), (500, 512)])
def test_served_rank_is_the_smallest_allowed_one_at_least_the_rank(rank: int, served: int) -> None:
    assert served_lora_rank(rank) == served


def test_rank_above_what_vllm_serves_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"trainer\.lora\.rank=1024.*trainer\.lora\.serve"):
        served_lora_rank(1024)


def test_server_config_turns_lora_and_runtime_loading_on(tmp_path: Path) -> None:
    server = VLLMServer(
        ServerConfig(str(tmp_path), lora_max_rank=16, max_loras=4, log_dir=str(tmp_path))
    )
    cmd = " ".join(server.command())
    assert "--enable-lora --max-lora-rank 16 --max-loras 4" in cmd
    assert server.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = VLLMServer(ServerConfig(str(tmp_path), log_dir=str(tmp_path)))
    assert "--enable-lora" not in plain.command()


async def test_each_push_loads_a_new_name_from_a_new_directory(vllm: Vllm, tmp_path: Path) -> None:
    router, _ = _router()
    sync = AdapterSync(router, shm_dir=str(tmp_path))
    try:
        src = _adapter_dir(tmp_path)
        r1 = await sync.push(src)
        r2 = await sync.push({"policy": src})
        loads = [b for p, b in vllm.calls if p == "/v1/load_lora_adapter"]
        assert [b["lora_name"] for b in loads] == ["policy-v1", "policy-v2"]
        assert loads[0]["lora_path"] != loads[1]["lora_path"]
        assert (r1.version, r2.version) == (1, 2)
        assert r2.num_bytes == 1000 + len(json.dumps({"r": 8, "lora_alpha": 16}))
        versions = [b["new_version"] for p, b in vllm.calls if p == "/update_weight_version"]
        assert versions == ["1", "2"]
        assert router.servers[0].weight_version == 2
        await sync.settle()
        assert set(vllm.loaded) == {"policy-v2"}  # v1 was idle: unloaded
        assert not await asyncio.to_thread(Path(loads[0]["lora_path"]).exists)  # dir removed
    finally:
        sync.close()


async def test_several_roles_push_at_once(vllm: Vllm, tmp_path: Path) -> None:
    router, _ = _router()
    sync = AdapterSync(router, shm_dir=str(tmp_path))
    try:
        src = _adapter_dir(tmp_path)
        await sync.push({"planner": src, "coder": src})
        assert set(vllm.loaded) == {"planner-v1", "coder-v1"}
        assert sync.table.current(URL, "coder") == sync.current["coder"]
    finally:
        sync.close()


async def test_request_in_flight_keeps_its_adapter_and_label(vllm: Vllm, tmp_path: Path) -> None:
    router, held = _router()
    sync = AdapterSync(router, shm_dir=str(tmp_path))
    try:
        src = _adapter_dir(tmp_path)
        base = asyncio.create_task(router.generate([1], SamplingParams()))
        await asyncio.sleep(0.01)
        await sync.push(src)
        old = asyncio.create_task(router.generate([1], SamplingParams()))
        await asyncio.sleep(0.01)
        await sync.push(src)
        new = asyncio.create_task(router.generate([1], SamplingParams()))
        await asyncio.sleep(0.01)
        assert held.models == [None, "policy-v1", "policy-v2"]
        await sync.settle()
        assert set(vllm.loaded) == {"policy-v1", "policy-v2"}  # v1 still in use
        held.go.set()
        gens = await asyncio.gather(base, old, new)
        assert [g.weight_versions for g in gens] == [[0] * 3, [1] * 3, [2] * 3]
        await sync.settle()
        assert set(vllm.loaded) == {"policy-v2"}  # unloaded once its request ended
    finally:
        sync.close()


@pytest.mark.parametrize(
    ("status", "text", "expect"),
    [
        (404, '{"detail":"Not Found"}', r"--enable-lora.*VLLM_ALLOW_RUNTIME_LORA_UPDATING.*"
         r"trainer\.lora\.serve: merged"),
        (500, "LoRA rank 16 is greater than max_lora_rank 8.", r"trainer\.lora\.rank=16 is "
         r"above the server's --max-lora-rank"),
        (500, "LoRA is not enabled. Use --enable-lora to enable LoRA.",
         r"started without --enable-lora.*trainer\.lora\.serve: merged"),
        (400, "unsupported target module", r"HTTP 400.*trainer\.lora.*serve: merged"),
    ],
)  # fmt: skip
async def test_refusals_name_the_setting_and_keep_labels_right(
    vllm: Vllm, tmp_path: Path, status: int, text: str, expect: str
) -> None:
    router, held = _router()
    held.go.set()
    sync = AdapterSync(router, shm_dir=str(tmp_path))
    try:
        await sync.push(_adapter_dir(tmp_path, "ok"))
        vllm.refuse = (status, text)
        with pytest.raises(AdapterRefused, match=expect):
            await sync.push(_adapter_dir(tmp_path, "big", rank=16))
        # the failed hot-load changed nothing: requests still go to v1, labelled v1
        gen = await router.generate([1], SamplingParams())
        assert held.models[-1] == "policy-v1" and gen.weight_versions == [1, 1, 1]
        assert router.servers[0].healthy and router.servers[0].weight_version == 1
    finally:
        sync.close()


async def test_restarted_server_gets_the_current_adapter(vllm: Vllm, tmp_path: Path) -> None:
    router, _ = _router()
    sync = AdapterSync(router, shm_dir=str(tmp_path))
    try:
        await sync.push(_adapter_dir(tmp_path))
        vllm.loaded.clear()  # the server restarted: it holds nothing
        await sync.load_current(router.servers[0])
        assert set(vllm.loaded) == {"policy-v1"}
        assert sync.table.current(URL).name == "policy-v1"  # type: ignore[union-attr]
    finally:
        sync.close()


def test_table_calls_on_idle_once_an_old_version_has_no_request() -> None:
    idle: list[str] = []
    t = AdapterTable(on_idle=lambda url, a: idle.append(a.name))
    v1, v2 = Adapter("policy", 1, Path("/a")), Adapter("policy", 2, Path("/b"))
    t.set_current(URL, v1)
    got = t.acquire(URL)
    t.set_current(URL, v2)
    assert idle == [] and t.in_flight(URL, "policy-v1") == 1
    t.release(URL, got)
    assert idle == ["policy-v1"]
    assert t.acquire(URL, "coder") is None  # no adapter for that role: the base model


def _trainer_with_adapter(calls: list[Path]) -> Any:
    class T:
        def save_adapter(self, d: Path) -> Path:
            calls.append(Path(d))
            Path(d).mkdir(parents=True)
            return Path(d)

        def step(self, trajs: Any) -> dict[str, float]:
            return {"n": 1.0}

    return T()


def test_snapshots_push_the_adapter_as_the_policy_role(tmp_path: Path) -> None:
    from agentrl.orchestration.adapter_weights import AdapterSnapshots

    calls: list[Path] = []
    snaps = AdapterSnapshots(_trainer_with_adapter(calls), shm_dir=str(tmp_path))
    try:
        paths = [snaps.state_dict_for_inference()["policy"] for _ in range(3)]
        assert paths == calls and len(set(paths)) == 3
        assert [p.exists() for p in paths] == [False, True, True]  # the last two kept
        assert snaps.step([]) == {"n": 1.0}  # other calls reach the trainer
    finally:
        snaps.close()


def test_serve_setting_defaults_to_adapter_and_pissa_needs_merged() -> None:
    from agentrl.trainer.config import LoraConfig

    assert LoraConfig().serve == "adapter"
    assert LoraConfig(init="pissa", serve="merged").serve == "merged"
    with pytest.raises(ValueError, match=r"pissa.*trainer\.lora\.serve: merged"):
        LoraConfig(init="pissa")


@pytest.mark.parametrize("api", ["completions", "generate"])
async def test_client_sends_the_adapter_name_and_labels_with_its_version(api: str) -> None:
    from agentrl.inference.client import make_client
    from tests.helpers.http_fakes import fake_server, reply

    body = {
        "choices": [
            {
                "token_ids": [5, 6],
                "logprobs": {
                    "token_logprobs": [-0.5, -0.25],
                    "content": [{"logprob": -0.5}, {"logprob": -0.25}],
                },
                "finish_reason": "length",
                # the server's own spans (its /update_weight_version label) are not used
                "weight_versions": [{"version": "9", "start": 0, "end": 2}],
            }
        ]
    }
    async with fake_server(lambda seen, n: reply(200, body)) as (url, seen):
        client = make_client(api, url, weight_version=lambda: 9)
        try:
            gen = await client.generate([1, 2], SamplingParams(), model="policy-v3", version=3)
        finally:
            await client.close()
    assert seen[0].body["model"] == "policy-v3"
    assert gen.weight_versions == [3, 3]
