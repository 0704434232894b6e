"""The two runs of ``benchmarks.vs_trl``: agentrl's GRPO and TRL's ``GRPOTrainer`` on one job.

Each runs in a subprocess of its own (``python -m benchmarks.vs_trl_runs agentrl|trl``),
so its peak memory is its own, and writes one JSON object of figures to ``--out``.

The job: configs/retool.yaml (SmolLM2-135M-Instruct, retool ``level: tiny`` with the
``python`` tool, three worked examples, G = 8, 4 prompts per step, 64 tokens per turn,
3 turns, lr 2e-5, AdamW), held-out success before and after on the same problems,
measured by agentrl's own evaluator (``evaluate_model``) on both sides.

TRL side: its multi-turn tool loop (``tools=[python]``). SmolLM2's ChatML template drops
tool calls, which TRL refuses (``supports_tool_calling``), so the tokenizer gets
:data:`HERMES_CHATML`: the same ChatML text for every message the prompts contain (the
worked examples are plain text), plus Hermes ``<tool_call>`` rendering of parsed calls,
and TRL's Qwen3 response parser (same ``<|im_start|>assistant`` anchor and ``<tool_call>``
format). Token ids are TRL's own concatenation (prompt + completion + tool suffix), so
what the model reads is ``<|im_start|>tool\\nRESULT<|im_end|>`` as in agentrl. The saved
model gets the base model's tokenizer files back before its evaluation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "retool.yaml"
CODE_TIMEOUT_S = 10.0  # RetoolEnv's code_timeout_s
nan = float("nan")


def _quiet(_m: str) -> None:
    pass


HERMES_CHATML = (
    "{%- for message in messages %}"
    "{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}{%- endif %}"
    "{%- if message.get('tool_calls') %}{%- for tc in message['tool_calls'] %}"
    "{%- if (message['content'] is string and message['content']) or not loop.first %}"
    "{{ '\\n' }}{%- endif %}"
    "{{ '<tool_call>\\n' + ({'name': tc['function']['name'], 'arguments': "
    "tc['function']['arguments']} | tojson) + '\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""SmolLM2's ChatML, plus Hermes ``<tool_call>`` blocks for an assistant's parsed calls."""


def overrides(steps: int, seed: int, eval_tasks: int, out: Path) -> list[str]:
    """The config overrides both runs share."""
    return [
        f"steps={steps}",
        f"seed={seed}",
        f"eval.num_tasks={eval_tasks}",
        "eval.every=0",
        f"output_dir={out}",
        "run_name=vs_trl",
        f"save_every={steps}",
        "wandb=disabled",
    ]


# ------------------------------------------------------------------------------ agentrl


def agentrl_figures(lines: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per-step generation/update seconds and token counts from a run's metrics lines."""
    steps = [m for m in lines if m.get("kind") == "train"]
    if not steps:
        raise ValueError("the run wrote no train metrics")
    gen = sum(float(m.get("time/generate", 0.0)) for m in steps)
    upd = sum(float(m.get("time/train", m.get("time/update", 0.0))) for m in steps)
    trainer_tok = sum(
        float(m.get("perf/step_tokens_per_s", 0.0)) * float(m.get("time/step", 0.0)) for m in steps
    )
    return {
        "steps": float(len(steps)),
        "gen_s": gen,
        "update_s": upd,
        "generated_tokens": sum(float(m.get("batch/model_tokens", 0.0)) for m in steps),
        "trainer_tokens": trainer_tok,
    }


def run_agentrl(a: argparse.Namespace) -> dict[str, float]:
    from agentrl.config import load_config
    from agentrl.orchestration.run import train
    from agentrl.reporting.run_dir import RunDir

    with tempfile.TemporaryDirectory(prefix="vs-trl-agentrl-") as tmp:
        cfg = load_config(CONFIG, [*overrides(a.steps, a.seed, a.eval_tasks, Path(tmp)), *a.set])
        result = asyncio.run(train(cfg, say=lambda _m: None))
        figures = agentrl_figures(list(RunDir(result.run_dir).metrics()))
    return {
        **figures,
        "before": float(result.eval_before["success"]),
        "after": float(result.eval_after["success"]),
    }


# ------------------------------------------------------------------------------ TRL


def python(code: str) -> str:
    """Runs a Python program and returns its printed output and errors.

    Each call starts a fresh interpreter: define everything you use, and print
    the values you want to see.

    Args:
        code: The complete Python program to run.
    """
    from agentrl.builtin_tools.python_interpreter import format_exec_result
    from agentrl.sandbox.base import ExecResult

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vs-trl-py-") as cwd:
        try:
            p = subprocess.run(
                [sys.executable, "-I", "-c", code], cwd=cwd, capture_output=True, text=True,
                timeout=CODE_TIMEOUT_S, stdin=subprocess.DEVNULL, errors="replace",
            )  # fmt: skip
            res = ExecResult(p.stdout, p.stderr, p.returncode, False, time.monotonic() - t0)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
            res = ExecResult(out, "", -9, True, time.monotonic() - t0)
    return format_exec_result(res, timeout_s=CODE_TIMEOUT_S)


def retool_reward(
    completions: list[list[dict[str, Any]]], answer: list[str], **_: Any
) -> list[float]:
    """RetoolEnv's reward: the first assistant turn with a ``\\boxed{}`` answer, scored."""
    from agentrl.envs.retool.reward import extract_boxed, score

    out = []
    for msgs, ans in zip(completions, answer, strict=True):
        r = 0.0
        for m in msgs:
            text = m.get("content") if m.get("role") == "assistant" else None
            if isinstance(text, str) and extract_boxed(text) is not None:
                r = score(text, ans).reward
                break
        out.append(r)
    return out


def trl_prompts(cfg: Any, n: int) -> list[dict[str, Any]]:
    """The first ``n`` training tasks in agentrl's order (its TaskStream), as TRL rows."""
    from agentrl.envs.retool.env import RetoolEnv
    from agentrl.orchestration.startup import load_tasks_for
    from agentrl.orchestration.tasks import TaskStream

    train_rows, _ = load_tasks_for(cfg, RetoolEnv)
    stream = TaskStream(train_rows, seed=cfg.seed)
    env = RetoolEnv(**cfg.env_kwargs)
    rows = []
    for i in range(n):
        task = stream.task(i)
        msgs = env.reset(task)
        prompt = [{"role": m.role, "content": m.content} for m in msgs]
        rows.append({"prompt": prompt, "answer": str(env.task.answer if env.task else "")})
    return rows


class _Timed:
    """Wraps the trainer's generation and its training step: seconds and tokens per step."""

    def __init__(self, trainer: Any) -> None:
        self.gen_s = self.step_s = 0.0
        self.generated = self.trained = 0.0
        gen, step = trainer._generate_and_score_completions, trainer.training_step

        def timed_gen(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = gen(*args, **kw)
            self.gen_s += time.perf_counter() - t0
            cm = out["completion_mask"]
            model_mask = cm * out["tool_mask"] if "tool_mask" in out else cm
            self.generated += float(model_mask.sum())
            self.trained += float(out["prompt_mask"].sum() + cm.sum())
            return out

        def timed_step(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = step(*args, **kw)
            self.step_s += time.perf_counter() - t0
            return out

        trainer._generate_and_score_completions = timed_gen
        trainer.training_step = timed_step


def trl_config(a: argparse.Namespace, out: str) -> Any:
    from trl import GRPOConfig

    mode = a.trl_mode
    vllm = {}
    if mode in ("colocate", "server"):
        vllm = {"use_vllm": True, "vllm_mode": mode, "vllm_max_model_length": 2048}
        if mode == "colocate":  # on vLLM-CPU the KV cache size comes from the environment
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return GRPOConfig(
        output_dir=out,
        max_steps=a.steps,
        seed=a.seed,
        learning_rate=2e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        per_device_train_batch_size=32,  # 4 prompts x G=8, one optimizer step per step
        gradient_accumulation_steps=1,
        num_generations=8,
        num_iterations=1,
        shuffle_dataset=False,  # agentrl's task order (trl_prompts)
        temperature=1.0,
        max_completion_length=640,  # all turns and tool results; agentrl: 1024 with the prompt
        generation_kwargs={"max_tokens" if vllm else "max_new_tokens": 64},  # per turn
        max_tool_calling_iterations=2,  # 3 turns
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",  # token mean over the batch: agentrl's token-mean
        scale_rewards="group",
        bf16=False,  # agentrl's trainer is fp32
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **vllm,
    )


@contextlib.contextmanager
def trl_vllm_server(model_dir: str, port: int, log: Path) -> Iterator[str]:
    """``trl vllm-serve`` on ``model_dir`` (its server mode); stopped on exit."""
    import urllib.request

    cmd = [str(Path(sys.executable).with_name("trl")), "vllm-serve", "--model", model_dir,
           "--port", str(port), "--max_model_len", "2048", "--enforce_eager", "true"]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"trl vllm-serve exited {proc.returncode}: {log.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("trl vllm-serve not healthy after 400 s") from None
                time.sleep(2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def patch_colocated_sync(gen: Any) -> None:
    """TRL's colocated weight sync, through vLLM's in-place reload.

    As shipped, TRL 1.16 calls ``model.load_weights([(name, param)])`` per parameter, which
    fails on vLLM-CPU 0.32 once its linear layers are repacked for the CPU kernels
    (``AttributeError: 'Parameter' object has no attribute 'weight_loader'``). vLLM's
    ``reload_weights(weights_iterator=...)`` restores the layers, loads and repacks them.
    """

    def sync_weights() -> None:
        runner = gen.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.reload_weights(weights_iterator=list(gen._iter_named_params()))
        gen.llm.reset_prefix_cache()

    gen.sync_weights = sync_weights


def run_trl(a: argparse.Namespace) -> dict[str, float]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from agentrl.config import load_config
    from agentrl.orchestration.run import evaluate_model
    from agentrl.orchestration.startup import resolve_model_dir

    with tempfile.TemporaryDirectory(prefix="vs-trl-trl-") as tmp:
        base = [*overrides(a.steps, a.seed, a.eval_tasks, Path(tmp)), *a.set]
        cfg = load_config(CONFIG, base)
        before = nan if a.skip_eval else asyncio.run(evaluate_model(cfg, say=_quiet))["success"]
        model_dir = resolve_model_dir(cfg, lambda _m: None)
        tok = AutoTokenizer.from_pretrained(model_dir)
        tok.chat_template = HERMES_CHATML
        tok.response_template = qwen3_template
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        rows = trl_prompts(cfg, a.steps * cfg.rollout.tasks_per_step)
        args = trl_config(a, str(Path(tmp) / "trl"))
        stack = contextlib.ExitStack()
        if a.trl_mode == "server":
            log = Path(tempfile.gettempdir()) / "vs-trl-vllm-serve.log"
            args.vllm_server_base_url = stack.enter_context(trl_vllm_server(model_dir, 8765, log))
        with stack:
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=retool_reward,
                args=args,
                train_dataset=Dataset.from_list(rows),
                processing_class=tok,
                tools=[python],
            )
            if a.trl_mode == "colocate":
                patch_colocated_sync(trainer.vllm_generation)
            timed = _Timed(trainer)
            trainer.train()
        saved = Path(tmp) / "trained"
        trainer.model.save_pretrained(saved)
        for f in Path(model_dir).iterdir():  # the base model's own tokenizer and template
            if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
                shutil.copy(f, saved / f.name)
        after_cfg = load_config(CONFIG, [*base, f"model.path={saved}"])
        after = (
            nan if a.skip_eval else asyncio.run(evaluate_model(after_cfg, say=_quiet))["success"]
        )
    return {
        "steps": float(a.steps),
        "gen_s": timed.gen_s,
        "update_s": timed.step_s - timed.gen_s,
        "generated_tokens": timed.generated,
        "trainer_tokens": timed.trained,
        "before": float(before),
        "after": float(after),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("framework", choices=["agentrl", "trl"])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument(
        "--trl-mode", default="transformers", choices=["transformers", "colocate", "server"]
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    p.add_argument("--skip-eval", action="store_true", help="TRL: no evaluations (probing)")
    a = p.parse_args()
    figures = run_agentrl(a) if a.framework == "agentrl" else run_trl(a)
    Path(a.out).write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
