"""Measures the tiny model's retool skill with plain transformers (no server).

Runs episodes of the demonstration format: question → (optional) python tool call
→ tool output → ``\\boxed{}`` answer, with the tool simulated by evaluating the
arithmetic expression. Used to check that the warm start is partial (some skill,
room to improve).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from pathlib import Path
from typing import Any

__all__ = ["probe_retool"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_BOXED = re.compile(r"\\boxed\{([^}]*)\}")
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _arith(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return int(_OPS[type(node.op)](_arith(node.left), _arith(node.right)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    raise ValueError("not arithmetic")


def _run_python(code: str) -> str:
    """Simulates the python tool for ``print(<integer arithmetic>)``."""
    try:
        tree = ast.parse(code.strip(), mode="eval")
        body = tree.body
        if isinstance(body, ast.Call) and getattr(body.func, "id", "") == "print" and body.args:
            return str(_arith(body.args[0]))
        return str(_arith(body))
    except (SyntaxError, ValueError, ZeroDivisionError):
        return "Error: could not run the code"


def probe_retool(
    model_dir: str | Path, n: int = 64, *, seed: int = 0, temperature: float = 0.0
) -> dict[str, float]:
    """Plays ``n`` held-out retool episodes (tiny level) with the model, the tool
    simulated; returns the tool-call rate and the accuracy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.loading.envs import resolve_env
    from agentrl.models.tiny import tiny_task_kwargs

    env_cls: Any = resolve_env("retool")
    env = env_cls()
    tools = [t.schema() for t in env.tools()]
    rows = env_cls.default_tasks(split="test", n=n, seed=seed, **tiny_task_kwargs("retool"))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    torch.manual_seed(seed)
    calls = correct = 0

    def turn(msgs: list[dict[str, Any]]) -> str:
        text = tok.apply_chat_template(
            msgs, tools=tools, tokenize=False, add_generation_prompt=True
        )
        ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
        kw: dict[str, Any] = (
            {"do_sample": True, "temperature": temperature}
            if temperature > 0
            else {"do_sample": False}
        )
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=64, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, **kw,
            )  # fmt: skip
        return str(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=False))

    for row in rows:
        answer = row["reward_model"]["ground_truth"]
        msgs: list[dict[str, Any]] = [m.to_dict() for m in env.reset(row)]
        reply = turn(msgs).split("<|im_end|>")[0]
        m = _CALL.search(reply)
        if m:
            calls += 1
            try:
                code = json.loads(m.group(1))["arguments"]["code"]
                output = _run_python(code)
            except (ValueError, KeyError, TypeError):
                output = "Error: malformed tool call"
            msgs += [
                {"role": "assistant", "content": reply[: m.start()].strip(), "tool_calls": [
                    {"type": "function", "function": {"name": "python", "arguments": m.group(1)}}
                ]},
                {"role": "tool", "content": output},
            ]  # fmt: skip
            reply = turn(msgs).split("<|im_end|>")[0]
        b = _BOXED.search(reply)
        correct += bool(b and b.group(1).strip() == answer)
    return {"tool_call_rate": calls / n, "accuracy": correct / n}
