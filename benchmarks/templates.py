"""Tokenization cost per turn for every template family, in both training strategies.

For each family of tests/data/templates/ (a 128-turn tool-using conversation, one
call per turn so every family renders it), times per turn:

- ``as_sampled``: the AgentLoop's delta — the new tool result rendered against
  the model's last turn (``ChatTokenizer.delta_ids(new, after=turn)``). Flat in the
  history: the ratio turn 128 / turn 2 should stay <= 1.5.
- ``per_turn``: the next sample's prompt — the whole conversation so far rendered
  and tokenized (``ChatTokenizer.prompt_ids``), as inference shows it. Grows with
  the history; also printed: the tokens tokenized over the episode (per_turn: every
  sample's prompt, which is what it trains on besides the sampled turns).

Run: ``python -m benchmarks.templates [--turns 128 --reps 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from agentrl.chat.tokenization import ChatTokenizer
from agentrl.types import Message
from benchmarks.delta_tokenization import conversation
from benchmarks.report import report

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "data" / "templates"))
from families import FAMILIES, family_tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code."}},
        },
    },
}


def per_turn_costs(
    chat: ChatTokenizer, msgs: list[Message], turns: int, strategy: str
) -> tuple[list[float], int]:
    """Seconds per turn, and the tokens tokenized over the episode."""
    out, tokens = [], 0
    for t in range(1, turns + 1):
        upto = 2 + 2 * t
        t0 = time.perf_counter()
        if strategy == "as_sampled":
            ids = chat.delta_ids(msgs[upto - 1 : upto], after=msgs[upto - 2])
        else:
            ids = chat.prompt_ids(msgs[:upto])
        out.append(time.perf_counter() - t0)
        tokens += len(ids)
    return out, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    msgs = conversation(a.turns)
    print(f"one {a.turns}-turn tool episode per family, median of {a.reps} runs per turn")
    print(
        f"{'family':20s} {'strategy':10s} {'turn2 us':>9s} {'turn' + str(a.turns) + ' us':>10s} "
        f"{'ratio':>6s} {'total ms':>9s} {'tokenized':>9s}"
    )
    worst = 0.0
    for name in FAMILIES:
        chat = ChatTokenizer(family_tokenizer(name), tools=[TOOL])
        for strategy in ("as_sampled", "per_turn"):
            runs = [per_turn_costs(chat, msgs, a.turns, strategy) for _ in range(a.reps)]
            med = [statistics.median(r[0][i] for r in runs) for i in range(a.turns)]
            early, late = statistics.median(med[0:3]), statistics.median(med[-3:])
            ratio = late / early
            if strategy == "as_sampled":
                worst = max(worst, ratio)
            print(
                f"{name:20s} {strategy:10s} {1e6 * early:9.0f} {1e6 * late:10.0f} "
                f"{ratio:6.2f} {1e3 * sum(med):9.1f} {runs[0][1]:9d}"
            )
    print(f"as_sampled worst ratio turn{a.turns}/turn2: {worst:.2f} (target <= 1.5)")
    report("as_sampled_worst_turn_last_over_turn2", worst, target=1.5, unit="x", better="lower")


if __name__ == "__main__":
    main()
