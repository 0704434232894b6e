"""docs/models.md's "Bring your model" table matches the code: for each family's template
(``tests/data/templates/``), what ``auto`` picks in the rollout loop, the doctor's
verdict and the training strategy are those the table names."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from agentrl.rollout.agent_loop import AgentLoop, LoopConfig
from agentrl.tools import HermesToolCallParser, make_turn_parser
from tests.data.templates.families import family_tokenizer
from tests.helpers.paths import REPO

MODELS_DOC = REPO / "docs" / "models.md"

# Table row label -> template family of tests/data/templates/families.py.
ROWS = {
    "Qwen2.5-Instruct": "qwen2_5",
    "Qwen3 (thinking)": "qwen3",
    "Llama-3.1 (JSON tools)": "llama3_1_json",
    "Llama-3.2 / 4 pythonic": "llama3_2_pythonic",
    "Mistral-Nemo": "mistral_nemo",
    "DeepSeek-V3.1": "deepseek_v3_1",
    "Hermes-2-Pro / 3": "hermes2pro",
    "gpt-oss (harmony)": "gpt_oss",
    "DeepSeek-R1-Distill": "deepseek_r1_distill",
    "GLM-4.5 / 4.6": "glm4_6",
    "SmolLM2 (ChatML, no tools)": "chatml_smollm2",
}

GLM_CALL = (
    "\n<think>Add them.</think>\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2"
    "</arg_value>\n<arg_key>b</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
)


def _table() -> dict[str, list[str]]:
    text = MODELS_DOC.read_text()
    start = text.index("| family | `rollout.tool_parser`")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


def _first_name(cell: str) -> str | None:
    """The parser a cell names ("–" or "none yet": none)."""
    if cell == "–" or cell.startswith("none yet"):
        return None
    m = re.match(r"`([a-z0-9_]+)`", cell)
    assert m, f"no parser name at the start of {cell!r}"
    return m.group(1)


def _name(parser: Any) -> str | None:
    if parser is None:
        return None
    return "hermes" if isinstance(parser, HermesToolCallParser) else str(parser.name)


def test_table_lists_every_family() -> None:
    assert set(_table()) == set(ROWS)


@pytest.mark.parametrize("label", sorted(ROWS))
def test_row_matches_the_code(label: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    tool_cell, reasoning_cell, verdict_cell, strategy = _table()[label]
    tool, reasoning = _first_name(tool_cell), _first_name(reasoning_cell)
    tok = family_tokenizer(ROWS[label])
    auto = LoopConfig(tool_parser="auto", reasoning_parser="auto")
    if tool is None:  # no usable parser: auto names the one it found and why it stops
        with pytest.raises(ValueError, match="cannot parse a finished turn"):
            AgentLoop(None, tok, auto)
        return
    if "set it" in tool_cell:
        with pytest.raises(ValueError, match="no known tool-call markup"):
            AgentLoop(None, tok, auto)
        auto = LoopConfig(tool_parser=tool, reasoning_parser="auto")
    if "set it" in reasoning_cell:  # auto cannot choose: it asks, naming the candidates
        with pytest.raises(ValueError, match="several reasoning formats"):
            AgentLoop(None, tok, auto)
        auto = LoopConfig(tool_parser="auto", reasoning_parser=reasoning)
    loop = AgentLoop(None, tok, auto)
    assert _name(loop.parser.tools) == tool
    assert _name(loop.parser.reasoning) == reasoning
    assert loop.template_report is not None
    verdict = "not consistent" if verdict_cell.startswith("not") else "consistent"
    assert (loop.template_report.verdict, loop.strategy) == (verdict, strategy)


def test_r1_distill_without_injected_tools_reads_its_own_calls() -> None:
    loop = AgentLoop(
        None,
        family_tokenizer("deepseek_r1_distill"),
        LoopConfig(tool_parser="auto", reasoning_parser="auto", inject_tools=False),
    )
    assert (_name(loop.parser.tools), _name(loop.parser.reasoning)) == (
        "deepseek_v3",
        "deepseek_r1",
    )


def test_glm_needs_its_own_reasoning_parser() -> None:
    tok = family_tokenizer("glm4_6")
    out = make_turn_parser("glm45", "glm45", tok).parse(GLM_CALL)
    assert out.reasoning == "Add them."
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("add", {"a": "2", "b": "3"})]
    # qwen3's split leaves the call without its <arg_key>/<arg_value> markup.
    bad = make_turn_parser("glm45", "qwen3", tok).parse(GLM_CALL)
    assert [c.name for c in bad.tool_calls] != ["add"]
