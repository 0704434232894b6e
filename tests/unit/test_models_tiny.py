"""The tiny model recipe: demonstrations, assistant-only loss mask, build + cache."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.models.demos import PYTHON_TOOL, copy_drills, retool_demonstrations
from agentrl.models.probe import _run_python
from agentrl.models.sft import encode_conversation
from agentrl.models.tiny import TinyRecipe, ensure_tiny_model
from agentrl.models.tokenizer import build_tokenizer

QUICK = TinyRecipe(num_demos=16, copy_steps=2, steps=2, batch_size=4, max_position_embeddings=512)


def test_demonstrations_follow_the_retool_contract():
    demos = retool_demonstrations(200, seed=0, tool_rate=0.7)
    assert demos == retool_demonstrations(200, seed=0, tool_rate=0.7)  # deterministic
    assert 0.6 < sum(d.uses_tool for d in demos) / 200 < 0.8  # partial on purpose
    for d in demos:
        final = d.messages[-1]
        assert final["role"] == "assistant"
        boxed = re.fullmatch(r"The answer is \\boxed\{(-?\d+)\}\.", final["content"])
        assert boxed is not None
        assert (boxed.group(1) == d.answer) == d.uses_tool  # guesses are wrong
        if d.uses_tool:
            call = d.messages[-3]["tool_calls"][0]["function"]
            assert call["name"] == "python" and set(call["arguments"]) == {"code"}
            assert _run_python(call["arguments"]["code"]) == d.answer == d.messages[-2]["content"]
    assert PYTHON_TOOL["function"]["parameters"]["required"] == ["code"]


def test_loss_mask_covers_exactly_the_assistant_turns():
    tok = build_tokenizer()
    demo = next(d for d in retool_demonstrations(20, seed=1) if d.uses_tool)
    ids, mask = encode_conversation(tok, demo.messages, [PYTHON_TOOL])
    text = tok.apply_chat_template(demo.messages, tools=[PYTHON_TOOL], tokenize=False)
    assert ids == tok.encode(text, add_special_tokens=False)
    learned = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    call = json.dumps(
        {"name": "python", "arguments": demo.messages[-3]["tool_calls"][0]["function"]["arguments"]}
    )
    assert (
        learned
        == f"<tool_call>{call}</tool_call><|im_end|>{demo.messages[-1]['content']}<|im_end|>"
    )


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


@pytest.mark.parametrize("code", ["print(2 + 3 * 4)", "2+3*4", "print(20 - 6)"])
def test_probe_tool_simulator(code):
    assert _run_python(code) == str(eval(code.removeprefix("print(").removesuffix(")")))


def test_recipe_rejects_head_dims_vllm_would_misread():
    from agentrl.models.tiny import tiny_config

    with pytest.raises(ValueError, match="head_dim"):
        tiny_config(TinyRecipe(hidden_size=128, num_heads=4), 3072, 2, 0)
