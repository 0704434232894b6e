"""RetoolEnv(worked_examples=N): solved exchanges before the task; the default is unchanged."""

from __future__ import annotations

import pytest

from agentrl.envs.retool.data import generate_tasks
from agentrl.envs.retool.env import SYSTEM_PROMPT, RetoolEnv
from agentrl.tools import get_parser


def test_default_reset_is_system_and_task_only():
    task = generate_tasks(1, level="tiny")[0]
    msgs = RetoolEnv().reset(task)
    assert [m.role for m in msgs] == ["system", "user"]
    assert msgs[0].content == SYSTEM_PROMPT


def test_worked_examples_come_between_system_and_task_and_parse_as_hermes_calls():
    task = generate_tasks(1, level="tiny")[0]
    msgs = RetoolEnv(worked_examples=3).reset(task)
    assert [m.role for m in msgs] == ["system"] + ["user", "assistant", "tool", "assistant"] * 3 + [
        "user"
    ]
    assert msgs[-1].content == task["prompt"][0]["content"]
    parser = get_parser("hermes")
    for call_msg, tool_msg, answer_msg in zip(msgs[2::4], msgs[3::4], msgs[4::4], strict=True):
        parsed = parser.parse(call_msg.content)
        (call,) = parsed.tool_calls
        assert call.name == "python" and not parsed.errors
        # the shown output is what the shown program prints, and the answer boxes it
        assert str(eval(call.arguments["code"][6:-1])) == tool_msg.content
        assert answer_msg.content == f"\\boxed{{{tool_msg.content}}}"


def test_too_many_worked_examples_is_refused():
    with pytest.raises(ValueError, match=r"worked_examples must be 0\.\.3"):
        RetoolEnv(worked_examples=4)
