"""A file of preference pairs (jsonl / json / parquet) → tokenized (chosen, rejected) episodes.

One row::

    {"prompt": "What is 2+2?" | [messages...],   # or "messages": [messages...]
     "chosen": "4" | {message} | [messages...],
     "rejected": "5" | {message} | [messages...],
     "tools": [schemas...]}                        # optional, OpenAI function format

``chosen`` / ``rejected`` are what follows the prompt: a string is one assistant
message; a list may hold several assistant turns with tool results between them.
Each side is rendered with the model's chat template turn by turn
(``agentrl.models.sft.encode_conversation``), and only its assistant tokens
(content and end-of-turn token, not the template's header) are scored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.types import Trajectory

__all__ = ["PairsFileError", "load_pairs_file"]


class PairsFileError(ValueError):
    """A preference-pairs file cannot be used; the message names the file and row."""


def _messages(value: Any, where: str, key: str, *, prompt: bool) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user" if prompt else "assistant", "content": value}]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not value:
        raise PairsFileError(f"{where}: {key!r} must be a string or a non-empty list of messages")
    for m in value:
        if not isinstance(m, dict) or "role" not in m:
            raise PairsFileError(f"{where}: every message of {key!r} needs a 'role', got {m!r}")
    return list(value)


def _episode(
    tok: Any,
    prompt: list[dict[str, Any]],
    reply: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    where: str,
    name: str,
    idx: int,
) -> Trajectory:
    from agentrl.models.sft import encode_conversation

    if not any(m["role"] == "assistant" for m in reply):
        raise PairsFileError(f"{where}: {name!r} holds no assistant message to train on")
    try:
        ids, mask = encode_conversation(tok, prompt + reply, tools)
        head, _ = encode_conversation(tok, prompt, tools)
    except ValueError as e:
        raise PairsFileError(f"{where}: {name}: {e}") from e
    if not any(mask) or mask[0]:
        raise PairsFileError(f"{where}: {name!r} has no assistant tokens after the prompt")
    n = len(ids)
    return Trajectory(
        task_id=f"pairs:{idx}",
        group_id=f"pairs:{idx}",
        episode_id=f"pairs:{idx}:{name}",
        token_ids=ids,
        loss_mask=mask,
        rollout_logprobs=[0.0] * n,
        weight_versions=[-1] * n,
        prompt_length=len(head),
        reward=1.0 if name == "chosen" else 0.0,
    )


def load_pairs_file(path: str | Path, tokenizer: Any) -> list[tuple[Trajectory, Trajectory]]:
    """Reads and tokenizes every pair of ``path``.

    Raises:
        PairsFileError: Missing or empty file, bad JSON, a row without its fields, or a
            conversation the chat template cannot render prefix-consistently (named).
    """
    from agentrl.loading.task_files import read_rows

    try:
        rows = read_rows(path)
    except (OSError, ValueError) as e:
        raise PairsFileError(f"preference pairs: {e}") from e
    if not rows:
        raise PairsFileError(f"preference pairs file {str(path)!r} holds no rows")
    out = []
    for idx, (where, row) in enumerate(rows):
        if not isinstance(row, dict):
            raise PairsFileError(f"{where}: a row must be an object, got {type(row).__name__}")
        missing = [k for k in ("chosen", "rejected") if k not in row]
        if "prompt" not in row and "messages" not in row:
            missing.insert(0, "prompt (or messages)")
        if missing:
            raise PairsFileError(f"{where}: missing {', '.join(missing)}")
        key = "prompt" if "prompt" in row else "messages"
        prompt = _messages(row[key], where, key, prompt=True)
        tools = row.get("tools") or None
        chosen = _messages(row["chosen"], where, "chosen", prompt=False)
        rejected = _messages(row["rejected"], where, "rejected", prompt=False)
        out.append(
            (
                _episode(tokenizer, prompt, chosen, tools, where, "chosen", idx),
                _episode(tokenizer, prompt, rejected, tools, where, "rejected", idx),
            )
        )
    return out
