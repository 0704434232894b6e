"""Supervised fine-tuning on chat demonstrations, loss on assistant tokens only.

Small and CPU-friendly: used to warm-start the tiny model. Conversations are
tokenized turn by turn through the chat template, so the assistant spans are
exactly the tokens the model would generate (content and ``<|im_end|>``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["encode_conversation", "train_sft"]


def _render(
    tok: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    gen: bool,
) -> list[int]:
    schemas = cast(Any, tools)  # transformers types tools as dict | Callable
    text = tok.apply_chat_template(
        messages, tools=schemas, tokenize=False, add_generation_prompt=gen
    )
    assert isinstance(text, str)
    return list(tok.encode(text, add_special_tokens=False))


def encode_conversation(
    tok: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids of a conversation and a mask that is 1 on assistant-generated tokens.

    The mask covers each assistant message's content and its end-of-turn token,
    not the template's ``<|im_start|>assistant\\n`` header nor the newline after.

    Raises:
        ValueError: The chat template is not prefix-consistent for ``messages``.
    """
    ids: list[int] = []
    mask: list[int] = []
    eos = tok.eos_token_id
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            head = _render(tok, messages[:i], tools, True) if i else []
            if head[: len(ids)] != ids:
                raise ValueError(f"chat template is not prefix-consistent at message {i}")
            mask += [0] * (len(head) - len(ids))
            ids = head
        full = _render(tok, messages[: i + 1], tools, False)
        if full[: len(ids)] != ids:
            raise ValueError(f"chat template is not prefix-consistent at message {i}")
        new = full[len(ids) :]
        if m["role"] == "assistant":
            end = new.index(eos) + 1 if eos in new else len(new)
            mask += [1] * end + [0] * (len(new) - end)
        else:
            mask += [0] * len(new)
        ids = full
    return ids, mask


def _common_prefix(batch: Sequence[tuple[list[int], list[int]]]) -> int:
    """Length of the token prefix every example of ``batch`` starts with (short of the
    shortest, so each example keeps a token after it)."""
    first = batch[0][0]
    n = min(len(ids) for ids, _ in batch) - 1
    for k in range(max(0, n)):
        if any(ids[k] != first[k] for ids, _ in batch):
            return k
    return max(0, n)


def _hidden_states(
    model: PreTrainedModel, inp: torch.Tensor, attn: torch.Tensor, prefix: int
) -> torch.Tensor:
    """Last hidden states of a right-padded batch ``inp`` [B, T].

    When the rows share a prefix of ``prefix`` tokens (the system prompt and tool
    schemas of every demonstration of one env), it is run once and its key/value
    cache repeated for the rows: the same values and gradients, a fraction of the
    compute when the prefix is most of each row.
    """
    decoder = model.get_decoder()
    if prefix < 16 or inp.shape[0] == 1:
        return cast(torch.Tensor, decoder(input_ids=inp, attention_mask=attn).last_hidden_state)
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    head = decoder(input_ids=inp[:1, :prefix], past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(inp.shape[0])
    tail = decoder(
        input_ids=inp[:, prefix:], attention_mask=attn, past_key_values=cache, use_cache=True
    )
    rows = inp.shape[0]
    return torch.cat([head.last_hidden_state.expand(rows, -1, -1), tail.last_hidden_state], dim=1)


def train_sft(
    model: PreTrainedModel,
    examples: Sequence[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int = 16,
    lr: float = 3e-3,
    warmup: int = 20,
    seed: int = 0,
    pad_id: int = 0,
    log: Callable[[int, float], None] | None = None,
    bf16: bool = False,
) -> list[float]:
    """Trains ``model`` in place with AdamW and a cosine schedule; returns the losses.

    Args:
        model: A causal LM.
        examples: (token ids, loss mask) pairs.
        steps: Optimizer steps.
        batch_size: Examples per step (sampled with a seeded RNG).
        lr: Peak learning rate.
        warmup: Linear warmup steps.
        seed: Seeds batch order and torch.
        pad_id: Token id used to pad batches.
        log: Called with (step, loss) after each step.
        bf16: Autocast matmuls to bfloat16 (fast on CPUs with AMX/AVX512-BF16).
    """
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = []
    order: list[int] = []
    for step in range(steps):
        if len(order) < batch_size:
            order = list(range(len(examples)))
            rng.shuffle(order)
        batch = [examples[order.pop()] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        inp = torch.full((batch_size, width), pad_id, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        attn = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (ids, mask) in enumerate(batch):
            t = torch.tensor(ids)
            inp[row, : len(ids)] = t
            attn[row, : len(ids)] = 1
            labels[row, : len(ids)] = torch.where(torch.tensor(mask) == 1, t, -100)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = _hidden_states(model, inp, attn, _common_prefix(batch))
            target = labels[:, 1:]
            sel = target != -100
            logits = model.get_output_embeddings()(hidden[:, :-1][sel])  # only where it counts
        loss = torch.nn.functional.cross_entropy(logits.float(), target[sel])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if log is not None:
            log(step, losses[-1])
    model.eval()
    return losses
