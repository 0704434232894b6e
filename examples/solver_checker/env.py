"""Two roles, one tool: a solver answers an arithmetic question, a checker verifies it.

The model plays both parts (``Env.roles``). The ``solver`` may call ``calc`` and ends its
part with ``ANSWER: n``; the ``checker`` sees the answer, may call ``calc`` too, and
writes ``VERDICT: correct`` or ``VERDICT: wrong``. A "wrong" verdict sends the question
back to the solver (``retries`` times at most). Reward (outcome): 1 when the answer the
episode ends with (accepted, or the last one when the turns run out) is right; else 0.

Each turn's role is recorded (``TurnSpan.role``); with ``trainer.lora.per_role: true``
each role is its own LoRA policy, and each turn samples from its role's adapter::

    agentrl train --env examples/solver_checker/env.py:SolveAndCheck \\
        trainer.lora.rank=8 trainer.lora.per_role=true
"""

from __future__ import annotations

import ast
import operator
import random
import re

from agentrl import Action, Env, Message, StepResult
from agentrl.tools import tool

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        right = _eval(node.right)
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0:
            raise ValueError("division by zero")
        return _OPS[type(node.op)](_eval(node.left), right)
    raise ValueError("only integers, + - * // % and parentheses")


def _value(expression: str) -> int:
    return _eval(ast.parse(expression, mode="eval").body)


class SolveAndCheck(Env):
    """A solver and a checker take turns on one integer arithmetic question."""

    roles = ("solver", "checker")
    max_turns = 8

    def __init__(self, retries: int = 1) -> None:
        self.retries = retries

    def reset(self, task, *, seed=None):
        self.question, self.truth = str(task["question"]), int(task["answer"])
        self.current, self.answer, self.retries_left = "solver", None, self.retries
        return [
            Message.system(
                "You play two parts. As the solver, answer with ANSWER: n. As the checker, "
                "check the answer and write VERDICT: correct or VERDICT: wrong. Either may "
                "use the calc tool."
            ),
            Message.user(f"Solver: what is {self.question}?"),
        ]

    def role(self) -> str:
        return self.current

    @tool
    def calc(self, expression: str) -> str:
        """Evaluates integer arithmetic.

        Args:
            expression: e.g. "(17 + 5) * 3"; + - * // % and parentheses.
        """
        try:
            return str(_value(expression))
        except (SyntaxError, ValueError, RecursionError) as e:
            return f"error: {e}"

    def tools(self):
        return [self.calc]

    def _end(self) -> StepResult:
        right = self.answer == self.truth
        return StepResult(reward=float(right), terminated=True, metrics={"correct": right})

    def step(self, action: Action) -> StepResult:
        answer = re.search(r"ANSWER:\s*(-?\d+)", action.content)
        if action.last_turn:  # no turn left: score what the solver answered so far
            if self.current == "solver" and answer:
                self.answer = int(answer.group(1))
            return self._end()
        if action.tool_calls or action.parse_errors:
            return StepResult()  # same role again: the tool results are in the conversation
        if self.current == "solver":
            if not answer:
                return StepResult(observation=[Message.user("Solver: write ANSWER: n.")])
            self.answer, self.current = int(answer.group(1)), "checker"
            ask = f"Checker: is {self.answer} the value of {self.question}? Write VERDICT: ..."
            return StepResult(observation=[Message.user(ask)])
        m = re.search(r"VERDICT:\s*(correct|wrong)", action.content, re.IGNORECASE)
        if not m:
            return StepResult(observation=[Message.user("Checker: write VERDICT: correct/wrong.")])
        if m.group(1).lower() == "wrong" and self.retries_left > 0:
            self.retries_left, self.current = self.retries_left - 1, "solver"
            again = f"Solver: the checker says {self.answer} is wrong. What is {self.question}?"
            return StepResult(observation=[Message.user(again)])
        return self._end()

    @staticmethod
    def default_tasks(split: str = "train", n: int = 256, seed: int = 0) -> list[dict]:
        """Questions ``a op b`` (two-digit numbers); the test split uses other seeds."""
        rng = random.Random(f"{split}:{seed}")
        out = []
        for i in range(n):
            q = f"{rng.randint(2, 99)} {rng.choice('+-*')} {rng.randint(2, 99)}"
            out.append({"id": f"{split}-{i}", "question": q, "answer": _value(q)})
        return out

    def example_task(self) -> dict:
        return {"id": "example", "question": "17 * 23", "answer": 391}
