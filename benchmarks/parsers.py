"""Parsing cost per turn: each vLLM parser adapter vs agentrl's own Hermes parser.

For each family, times ``parse`` on two turns written in that family's format —
one with text and two tool calls, one plain answer without a call — and prints
the median cost per turn and its ratio to agentrl's ``HermesToolCallParser`` on
the same two turns in Hermes format, all measured in this run. Reasoning
parsers are timed the same way, as a ``TurnParser`` (reasoning split + Hermes)
against Hermes alone. Also prints what building each adapter costs (once per
run; ``with_tools`` rebuilds it once per distinct tool set).

Run: ``python -m benchmarks.parsers [--reps 2000]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from agentrl.testing.tokenizers import byte_tokenizer
from agentrl.tools import HermesToolCallParser, make_tool_parser, make_turn_parser
from benchmarks.report import report

DS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
)
SEP = "<｜tool▁sep｜>"
KIMI = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
PLAIN = "The sum of 17 and 25 is 42, and the product of 3 and 4 is 12. ANSWER 42"
LEAD = "I will compute both with the tools."

# family -> (special tokens, the turn with two calls)
FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "vllm:hermes": (
        ("<tool_call>", "</tool_call>"),
        f'{LEAD}\n<tool_call>\n{{"name": "add", "arguments": {{"a": 17, "b": 25}}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "mul", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
    ),
    "qwen3_xml": (
        ("<tool_call>", "</tool_call>"),
        f"{LEAD}\n<tool_call>\n<function=add>\n<parameter=a>\n17\n</parameter>\n<parameter=b>\n25\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=mul>\n<parameter=a>\n3\n"
        "</parameter>\n<parameter=b>\n4\n</parameter>\n</function>\n</tool_call>",
    ),
    "llama3_json": (
        ("<|python_tag|>",),
        '<|python_tag|>{"name": "add", "parameters": {"a": 17, "b": 25}}; '
        '{"name": "mul", "parameters": {"a": 3, "b": 4}}',
    ),
    "pythonic": ((), "[add(a=17, b=25), mul(a=3, b=4)]"),
    "llama4_pythonic": (
        ("<|python_start|>", "<|python_end|>"),
        "<|python_start|>[add(a=17, b=25), mul(a=3, b=4)]<|python_end|>",
    ),
    "mistral": (
        ("[TOOL_CALLS]", "[ARGS]"),
        f'{LEAD}[TOOL_CALLS]add[ARGS]{{"a": 17, "b": 25}}[TOOL_CALLS]mul[ARGS]{{"a": 3, "b": 4}}',
    ),
    "deepseek_v3": (
        (*DS, SEP),
        f"{LEAD}{DS[0]}{DS[2]}function{SEP}add\n```json\n"
        f'{{"a": 17, "b": 25}}\n```{DS[3]}{DS[2]}function{SEP}mul\n```json\n{{"a": 3, "b": 4}}\n```'
        f"{DS[3]}{DS[1]}",
    ),
    "deepseek_v31": (
        (*DS, SEP),
        f'{LEAD}{DS[0]}{DS[2]}add{SEP}{{"a": 17, "b": 25}}{DS[3]}{DS[2]}mul{SEP}'
        f'{{"a": 3, "b": 4}}{DS[3]}{DS[1]}',
    ),
    "kimi_k2": (
        KIMI,
        f'{LEAD}{KIMI[0]}{KIMI[2]}functions.add:0{KIMI[3]}{{"a": 17, "b": 25}}{KIMI[4]}'
        f'{KIMI[2]}functions.mul:1{KIMI[3]}{{"a": 3, "b": 4}}{KIMI[4]}{KIMI[1]}',
    ),
    "harmony": (  # agentrl's gpt-oss parser (openai_harmony); needs no tokenizer specials
        (),
        f"<|channel|>commentary<|message|>{LEAD}<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.add <|constrain|>json<|message|>{"a": 17, "b": 25}<|call|><|start|>assistant'
        '<|channel|>commentary to=functions.mul <|constrain|>json<|message|>{"a": 3, "b": 4}',
    ),
}
HERMES_CALLS = FAMILIES["vllm:hermes"][1]
REASONING = {
    "deepseek_r1": "<think>Two operations: add, then multiply.</think>",
    "qwen3": "<think>\nTwo operations: add, then multiply.\n</think>\n\n",
}


def per_turn_us(parse: Callable[[str], object], turns: tuple[str, ...], reps: int) -> float:
    """Median over ``reps`` rounds of the mean cost of parsing one of ``turns``, in µs."""
    for t in turns:  # warm caches and lazy compiles
        parse(t)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for t in turns:
            parse(t)
        samples.append((time.perf_counter() - t0) / len(turns))
    return 1e6 * statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2000)
    a = p.parse_args()
    hermes = HermesToolCallParser()
    base = per_turn_us(hermes.parse, (HERMES_CALLS, PLAIN), a.reps)
    print(f"parse cost per turn (median of {a.reps} rounds; a turn with 2 calls + a plain one)")
    print(f"  {'agentrl hermes (baseline)':30s} {base:8.1f} us/turn  ratio  1.00")
    report("hermes_us_per_turn", base, unit="us", better="lower")
    for name, (specials, calls_turn) in FAMILIES.items():
        t0 = time.perf_counter()
        parser = make_tool_parser(name, byte_tokenizer(*specials))
        build_ms = 1e3 * (time.perf_counter() - t0)
        out = parser.parse(calls_turn)
        assert len(out.tool_calls) == 2 and not out.errors, (name, out)
        plain = f"<|channel|>final<|message|>{PLAIN}" if name == "harmony" else PLAIN
        us = per_turn_us(parser.parse, (calls_turn, plain), a.reps)
        note = " incl. importing vLLM" if name == next(iter(FAMILIES)) else ""
        print(
            f"  {name:30s} {us:8.1f} us/turn  ratio {us / base:5.2f}  "
            f"(build {build_ms:.1f} ms{note})"
        )
        report(f"{name}_vs_hermes", us / base, unit="x", better="lower", baseline=base)
    print("reasoning split + agentrl hermes, vs agentrl hermes alone")
    for name, prefix in REASONING.items():
        tok = byte_tokenizer("<think>", "</think>", "<tool_call>", "</tool_call>")
        turn = make_turn_parser("hermes", name, tok)
        texts = (prefix + HERMES_CALLS, prefix + PLAIN)
        assert turn.parse(texts[0]).reasoning and len(turn.parse(texts[0]).tool_calls) == 2
        us = per_turn_us(turn.parse, texts, a.reps)
        print(f"  {name + ' + hermes':30s} {us:8.1f} us/turn  ratio {us / base:5.2f}")
        report(f"{name}+hermes_vs_hermes", us / base, unit="x", better="lower", baseline=base)


if __name__ == "__main__":
    main()
