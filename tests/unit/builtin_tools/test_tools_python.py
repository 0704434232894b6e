"""The built-in `python` tool against a fake Sandbox."""

from __future__ import annotations

from typing import Self

import pytest

from agentrl.builtin_tools.python_interpreter import PythonInterpreter
from agentrl.sandbox.base import ExecResult, Sandbox
from agentrl.tools import Tool, ToolArgumentError, ToolExecutor
from agentrl.types import ToolCall


class FakeSandbox:
    """A Sandbox double: records run_code calls and answers with a preset result."""

    def __init__(self, result: ExecResult) -> None:
        self.result = result
        self.calls: list[tuple[str, str, float | None]] = []

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        raise AssertionError("the python tool must use run_code")

    async def write_file(self, path: str, data: str | bytes) -> None:
        raise AssertionError("unused")

    async def read_file(self, path: str) -> bytes:
        raise AssertionError("unused")

    async def run_code(
        self, code: str, *, language: str = "python", timeout_s: float | None = None
    ) -> ExecResult:
        self.calls.append((code, language, timeout_s))
        return self.result


def make(
    stdout: str = "",
    stderr: str = "",
    exit_code: int = 0,
    timed_out: bool = False,
    duration_s: float = 0.0,
) -> FakeSandbox:
    return FakeSandbox(ExecResult(stdout, stderr, exit_code, timed_out, duration_s))


def test_schema() -> None:
    sb = make()
    assert isinstance(sb, Sandbox)  # the double really implements the protocol
    py = PythonInterpreter(sb)
    assert isinstance(py, Tool)
    assert py.schema() == {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Runs a Python program and returns its printed output and errors.\n\n"
            "Each call starts a fresh interpreter: define everything you use, and print\n"
            "the values you want to see.",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The complete Python program to run."}
                },
                "required": ["code"],
                "additionalProperties": False,
            },
        },
    }


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (ExecResult("4\n", "", 0), "4"),
        (ExecResult("", "", 0), "[no output]"),
        (
            ExecResult("1\n", "Traceback (most recent call last):\nZeroDivisionError: x\n", 1),
            "1\nTraceback (most recent call last):\nZeroDivisionError: x\n[exit code 1]",
        ),
        (
            ExecResult("partial\n", "", -9, timed_out=True, duration_s=5.0),
            "partial\n[timed out after 5s]",
        ),
        (ExecResult("", "", -9), "[killed by signal SIGKILL]"),
        (ExecResult("", "", 3), "[exit code 3]"),
    ],
)
async def test_output_format(result: ExecResult, expected: str) -> None:
    sb = FakeSandbox(result)
    py = PythonInterpreter(sb)
    assert await py.call({"code": "print(1/0)"}) == expected
    assert sb.calls == [("print(1/0)", "python", None)]


async def test_timeout_is_passed_to_the_sandbox_and_reported() -> None:
    sb = make("", "", -9, timed_out=True, duration_s=2.01)
    py = PythonInterpreter(sb, timeout_s=2.0)
    assert await py.call({"code": "while True: pass"}) == "[timed out after 2s]"
    assert sb.calls == [("while True: pass", "python", 2.0)]


async def test_bad_arguments_never_reach_the_sandbox() -> None:
    sb = make("x")
    py = PythonInterpreter(sb)
    with pytest.raises(ToolArgumentError, match="code: missing required argument"):
        await py.call({"source": "print(1)"})
    assert sb.calls == []


async def test_each_instance_uses_its_own_sandbox_through_the_executor() -> None:
    a, b = make("from a\n"), make("from b\n")
    pa = PythonInterpreter(a)
    pb = PythonInterpreter(b)
    res_a = await ToolExecutor([pa]).run([ToolCall("python", {"code": "1"}, "call_0")])
    res_b = await ToolExecutor([pb]).run([ToolCall("python", {"code": "2"}, "call_0")])
    assert res_a.messages[0].content == "from a"
    assert res_b.messages[0].content == "from b"
    assert a.calls == [("1", "python", None)] and b.calls == [("2", "python", None)]
