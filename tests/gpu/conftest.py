"""The GPU tier: real vLLM servers on CUDA, bf16 + FSDP2 trainer steps, NCCL weight sync.

Every test under tests/gpu is marked ``gpu`` and skipped (not failed) when torch sees
no CUDA device, so ``pytest tests/gpu`` collects and skips cleanly on a CPU machine.
``make gpu-test`` runs them on a GPU machine (the GPU build of vLLM, ``pip install -e
'.[gpu]'``, must be installed there). No hub is needed: the models are built locally
(the untrained tiny model with its own tokenizer, and a Qwen2.5-1.5B-shaped model with
random weights that borrows the tiny tokenizer).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.models.tiny import TinyRecipe, ensure_tiny_model
from agentrl.types import Trajectory

HERE = Path(__file__).parent
# Untrained tiny model: the format is what matters here, and it builds in seconds.
UNTRAINED = TinyRecipe(steps=0, copy_steps=0, num_demos=0, max_position_embeddings=4096)
# Qwen2.5-1.5B's shape (hidden 1536, 28 layers, 12 heads of 128, 2 kv heads, vocab 151936).
QWEN15B_SHAPE = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True,
    max_position_embeddings=32768, rope_theta=1_000_000.0,
)  # fmt: skip
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "chat_template.jinja", "generation_config.json")  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


def need_gpu_vllm() -> None:
    """Fails (not skips) on a GPU machine without vLLM: the tier would test nothing."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("GPU tests need vLLM's CUDA build: pip install -e '.[gpu]'")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get("AGENTRL_CACHE_DIR") or tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def tiny_dir(cache_dir: Path) -> Path:
    return ensure_tiny_model(UNTRAINED, cache_dir=cache_dir)


@pytest.fixture(scope="session")
def qwen15b_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2.5-1.5B-shaped model with random weights (bf16 safetensors), built on the GPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("qwen15b-shape")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN15B_SHAPE)).to(torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    torch.cuda.empty_cache()
    for name in _TOKENIZER_FILES:  # the tiny tokenizer's ids are all < 151936
        if (tiny_dir / name).is_file():
            shutil.copy2(tiny_dir / name, out / name)
    return out


def server_config(model_dir: Path, log_dir: Path, **kw: Any) -> Any:
    from agentrl.inference.server import ServerConfig

    base: dict[str, Any] = dict(
        model=str(model_dir), device="cuda", dtype="bfloat16", max_model_len=4096,
        max_num_seqs=32, gpu_memory_utilization=0.25, startup_timeout_s=600,
        log_dir=str(log_dir),
    )  # fmt: skip
    base.update(kw)
    return ServerConfig(**base)


@pytest.fixture(scope="session")
async def gpu_fleet(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """One bf16 vLLM server on GPU 0 (a quarter of its memory; the trainer shares it)."""
    from agentrl.inference.fleet import Fleet

    need_gpu_vllm()
    cfg = server_config(tiny_dir, tmp_path_factory.mktemp("vllm-gpu-logs"))
    fleet = await Fleet.launch(cfg, num_servers=1, health_interval_s=2.0)
    try:
        yield fleet
    finally:
        await fleet.close()


def trajectory(prompt: list[int], response: list[int], logprobs: list[float], i: int = 0,
               reward: float = 1.0, version: int = 0) -> Trajectory:  # fmt: skip
    """A one-turn episode: ``prompt`` (mask 0) then the sampled ``response`` (mask 1)."""
    n_p, n_r = len(prompt), len(response)
    return Trajectory(
        task_id=f"t{i // 4}", group_id=f"t{i // 4}", episode_id=f"e{i}",
        token_ids=list(prompt) + list(response), loss_mask=[0] * n_p + [1] * n_r,
        rollout_logprobs=[0.0] * n_p + list(logprobs),
        weight_versions=[-1] * n_p + [version] * n_r, reward=reward,
    )  # fmt: skip


def random_episodes(n: int, length: int, vocab: int, prompt: int = 32) -> list[Trajectory]:
    """``n`` episodes of random tokens, rewards alternating within groups of 4."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        out.append(trajectory(ids[:prompt], ids[prompt:], [-5.0] * (length - prompt), i,
                              reward=float(i % 2)))  # fmt: skip
    return out
