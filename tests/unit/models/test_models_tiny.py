"""The tiny model recipe: demonstrations, assistant-only loss mask, build + cache."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.envs.retool import RetoolEnv
from agentrl.envs.retool.data import generate_tasks
from agentrl.envs.retool.demos import TINY_TOOL_RATES, demonstrations
from agentrl.models.demos import copy_drills
from agentrl.models.probe import _run_python
from agentrl.models.sft import encode_conversation
from agentrl.models.tiny import TinyRecipe, cached_dir, ensure_tiny_model, tiny_task_kwargs
from agentrl.models.tokenizer import build_tokenizer
from agentrl.types import Action

QUICK = TinyRecipe(num_demos=16, copy_steps=2, steps=2, batch_size=4, max_position_embeddings=512)


def test_demonstrations_follow_the_retool_contract():
    demos = demonstrations(RetoolEnv(), 400, seed=0)
    assert demos == demonstrations(RetoolEnv(), 400, seed=0)  # deterministic
    env = RetoolEnv()
    tools = [t.schema() for t in env.tools()]
    by_kind: dict[str, list[bool]] = {}
    for d, row in zip(demos, generate_tasks(400, seed=0, level="tiny"), strict=True):
        assert d.tools == tools  # what the env shows the model
        assert d.messages[:2] == [m.to_dict() for m in env.reset(row)]
        by_kind.setdefault(row["kind"], []).append(d.uses_tool)
        final = d.messages[-1]
        boxed = re.fullmatch(r"The answer is \\boxed\{(-?\d+)\}\.", final["content"])
        assert boxed is not None
        assert (boxed.group(1) == d.answer) == d.uses_tool  # guesses are wrong
        assert env.step(Action(text=final["content"])).reward == float(d.uses_tool)
        if d.uses_tool:
            call = d.messages[-3]["tool_calls"][0]["function"]
            assert call == {"name": "python", "arguments": {"code": row["solution"]}}
            assert _run_python(row["solution"]) == d.answer == d.messages[-2]["content"]
    rates = {k: sum(v) / len(v) for k, v in by_kind.items()}
    for kind, rate in rates.items():  # partial on purpose, and unequal across kinds
        assert abs(rate - TINY_TOOL_RATES[kind]) < 0.15, (kind, rate)
    assert len(rates) == 4


def test_loss_mask_covers_exactly_the_assistant_turns():
    tok = build_tokenizer()
    demo = next(d for d in demonstrations(RetoolEnv(), 20, seed=1) if d.uses_tool)
    ids, mask = encode_conversation(tok, demo.messages, demo.tools)
    text = tok.apply_chat_template(demo.messages, tools=demo.tools, tokenize=False)
    assert ids == tok.encode(text, add_special_tokens=False)
    learned = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    call = json.dumps(
        {"name": "python", "arguments": demo.messages[-3]["tool_calls"][0]["function"]["arguments"]}
    )
    assert (
        learned
        == f"<tool_call>{call}</tool_call><|im_end|>{demo.messages[-1]['content']}<|im_end|>"
    )


def test_tiny_model_tasks_are_the_ones_it_was_warm_started_on():
    assert tiny_task_kwargs("retool") == {"level": "tiny"}
    assert tiny_task_kwargs("swe") == {}


def test_recipe_needs_an_env_with_demonstrations(tmp_path):
    with pytest.raises(ValueError, match="demonstrations"):
        ensure_tiny_model(dataclasses.replace(QUICK, env="swe"), cache_dir=tmp_path)


def test_copy_drills_mask_the_repeats():
    ids, mask = copy_drills(list(range(10, 20)), [5], 1, seed=0)[0]
    copied = [i for i, m in zip(ids, mask, strict=True) if m]
    assert len(copied) % 2 == 0 and copied[: len(copied) // 2] == copied[len(copied) // 2 :]


def test_recipe_key_is_stable_and_sensitive():
    assert TinyRecipe().key() == TinyRecipe().key()
    assert TinyRecipe(seed=1).key() != TinyRecipe().key()


def test_ensure_tiny_model_builds_once_and_loads(tmp_path):
    path = ensure_tiny_model(QUICK, cache_dir=tmp_path)
    assert path.name == f"tiny-{QUICK.key()}" and path.parent == tmp_path / "models"
    mtime = (path / "model.safetensors").stat().st_mtime
    assert ensure_tiny_model(QUICK, cache_dir=tmp_path) == path  # cached: no rebuild
    assert (path / "model.safetensors").stat().st_mtime == mtime
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["head_dim"] == 64
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert tok.chat_template and model.config.eos_token_id == tok.eos_token_id
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, cfg["vocab_size"])


def test_build_is_deterministic(tmp_path):
    a = ensure_tiny_model(QUICK, cache_dir=tmp_path / "a")
    b = ensure_tiny_model(QUICK, cache_dir=tmp_path / "b")
    wa = AutoModelForCausalLM.from_pretrained(str(a)).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(str(b)).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("code", ["print(2 + 3 * 4)", "2+3*4", "print(20 - 6)", "print(4553 % 17)"])
def test_probe_tool_simulator(code):
    assert _run_python(code) == str(eval(code.removeprefix("print(").removesuffix(")")))


def test_recipe_rejects_head_dims_vllm_would_misread():
    from agentrl.models.tiny import tiny_config

    with pytest.raises(ValueError, match="head_dim"):
        tiny_config(TinyRecipe(hidden_size=128, num_heads=4), 3072, 2, 0)


def test_shared_prefix_gives_the_same_hidden_states_and_gradients():
    from agentrl.models.sft import _common_prefix, _hidden_states
    from agentrl.models.tiny import tiny_config

    tok = build_tokenizer()
    batch = [
        encode_conversation(tok, d.messages, d.tools)
        for d in demonstrations(RetoolEnv(), 6, seed=3)
    ]
    prefix = _common_prefix(batch)
    assert 100 < prefix < min(len(ids) for ids, _ in batch)  # system prompt + tool schemas
    width = max(len(ids) for ids, _ in batch)
    inp = torch.zeros((6, width), dtype=torch.long)
    attn = torch.zeros((6, width), dtype=torch.long)
    for row, (ids, _) in enumerate(batch):
        inp[row, : len(ids)], attn[row, : len(ids)] = torch.tensor(ids), 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(TinyRecipe(), len(tok), 2, 0))
    grads = []
    for p in (0, prefix):  # 0: the plain full-batch forward
        model.zero_grad()
        hidden = _hidden_states(model, inp, attn, p)
        (hidden * attn[..., None]).square().mean().backward()
        grads.append(([x.grad.clone() for x in model.parameters()], hidden.detach()))
    (g0, h0), (g1, h1) = grads
    keep = attn == 1
    assert torch.allclose(h0[keep], h1[keep], atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(g0, g1, strict=True))


def test_common_prefix_stops_where_rows_differ():
    from agentrl.models.sft import _common_prefix

    assert _common_prefix([([1, 2, 3, 4], []), ([1, 2, 5, 6, 7], [])]) == 2
    assert _common_prefix([([1, 2, 3], []), ([1, 2, 3, 4], [])]) == 2  # keeps one token after


def test_cached_dir_builds_once_shared_and_leaves_nothing_when_a_build_fails(tmp_path):
    builds = []

    def build(d):
        builds.append(d)
        (d / "weights").write_text("w")
        (d / "done.json").write_text("{}")

    announced = []
    path = cached_dir(tmp_path / "models", "m-abc", "done.json", build, announce=announced.append)
    assert path == tmp_path / "models" / "m-abc" and (path / "weights").read_text() == "w"
    assert announced == [path] and (path.stat().st_mode & 0o777) == 0o755  # others can read it
    assert cached_dir(tmp_path / "models", "m-abc", "done.json", build) == path
    assert len(builds) == 1  # cached: no rebuild

    def broken(d):
        (d / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        cached_dir(tmp_path / "models", "m-def", "done.json", broken)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        ".m-abc.lock",
        ".m-def.lock",
        "m-abc",
    ]
