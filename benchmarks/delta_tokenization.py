"""Delta tokenization vs full re-templating, over one 128-turn episode.

For each turn of a synthetic 128-turn tool-using conversation, times (a) the
AgentLoop's delta path — render and tokenize only the new messages — and (b) the
naive path — render the whole conversation through the chat template and
tokenize it again. Prints the per-turn cost ratio turn 128 / turn 2 for each
(delta target ≤ 1.5: flat) and the total tokenization time as a share of the
episode's wall time when generation takes ``--gen-ms`` per turn.

Run: ``python -m benchmarks.delta_tokenization [--turns 128 --reps 5 --gen-ms 50]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from agentrl.chat.tokenization import ChatTokenizer
from agentrl.models.tokenizer import build_tokenizer
from agentrl.types import Message, ToolCall
from benchmarks.report import report

TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
    },
}


def conversation(turns: int) -> list[Message]:
    """System, user, then (assistant with one call, tool result) pairs."""
    msgs = [Message.system("You solve math with Python."), Message.user("Compute things.")]
    for t in range(turns):
        call = ToolCall("python", {"code": f"print({t} * 12345)"}, id=f"call_{t}")
        msgs.append(Message.assistant(f"Step {t}: computing.", (call,)))
        msgs.append(Message.tool(str(t * 12345), tool_call_id=call.id, name="python"))
    return msgs


def per_turn_times(chat: ChatTokenizer, msgs: list[Message], turns: int, full: bool) -> list[float]:
    out = []
    for t in range(1, turns + 1):
        upto = 2 + 2 * t  # system, user, then (assistant, tool) pairs
        t0 = time.perf_counter()
        if full:
            chat.encode(chat.render(msgs[:upto], add_generation_prompt=True))
        else:
            chat.delta_ids(msgs[upto - 1 : upto])
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--gen-ms", type=float, default=50.0, help="assumed generation time per turn")
    a = p.parse_args()
    chat = ChatTokenizer(build_tokenizer(), tools=[TOOL])
    msgs = conversation(a.turns)
    res = {}
    for name, full in (("delta", False), ("full re-template", True)):
        runs = [per_turn_times(chat, msgs, a.turns, full) for _ in range(a.reps)]
        med = [statistics.median(r[i] for r in runs) for i in range(a.turns)]
        res[name] = med
    print(f"one {a.turns}-turn episode, median of {a.reps} runs, generation {a.gen_ms} ms/turn")
    for name, med in res.items():
        total = sum(med)
        wall = total + a.turns * a.gen_ms / 1000
        # Turn 2 and turn N, each as the median of a 3-turn window to damp noise.
        early = statistics.median(med[0:3])
        late = statistics.median(med[-3:])
        print(
            f"  {name:17s} turn2={1e6 * early:8.0f}us turn{a.turns}={1e6 * late:8.0f}us "
            f"ratio={late / early:5.2f} total={1e3 * total:8.1f}ms share of wall={total / wall:.3f}"
        )
        if name == "delta":
            report("delta_turn_last_over_turn2", late / early, target=1.5, unit="x", better="lower")
            report("delta_share_of_wall", total / wall, better="lower")
    print(
        f"  total time full / delta: {sum(res['full re-template']) / sum(res['delta']):.1f}x; "
        f"delta ratio target <= 1.5"
    )
    report("full_over_delta_total_time", sum(res["full re-template"]) / sum(res["delta"]), unit="x")


if __name__ == "__main__":
    main()
