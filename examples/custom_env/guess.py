"""A multi-turn env with a tool, written against agentrl's public API only.

The model must find a secret number. It may call ``check(guess)``, which says
"higher", "lower" or "correct", as often as its turn budget allows, and ends the
episode by writing ``ANSWER: n``. Reward 1 for the right answer, minus 0.05 per
check (so fewer checks are better).

Train it: ``agentrl train --config configs/custom-env.yaml``.
"""

from __future__ import annotations

import random
import re

from agentrl import Action, Env, Message, StepResult
from agentrl.tools import tool


class GuessNumber(Env):
    """Find a secret number in [1, high] with a comparison tool."""

    max_turns = 6

    def reset(self, task, *, seed=None):
        self.secret, self.high, self.checks = int(task["secret"]), int(task["high"]), 0
        return [
            Message.system("Use the check tool to find the number, then write ANSWER: n."),
            Message.user(f"I am thinking of a number from 1 to {self.high}. What is it?"),
        ]

    @tool
    def check(self, guess: int) -> str:
        """Compares a guess with the secret number.

        Args:
            guess: Your guess.
        """
        self.checks += 1
        if guess == self.secret:
            return "correct"
        return "higher" if guess < self.secret else "lower"

    def tools(self):
        return [self.check]

    def step(self, action: Action) -> StepResult:
        m = re.search(r"ANSWER:\s*(-?\d+)", action.content)
        if m:
            reward = float(int(m.group(1)) == self.secret) - 0.05 * self.checks
            return StepResult(reward=reward, terminated=True, metrics={"checks": self.checks})
        if action.tool_calls or action.parse_errors:
            return StepResult()  # keep going: the tool results are already in the conversation
        nudge = Message.user("Call check(guess) or write ANSWER: n.")
        return StepResult(observation=[nudge])

    @staticmethod
    def default_tasks(split: str = "train", n: int = 256, seed: int = 0) -> list[dict]:
        """Tasks: a secret and a range; the test split uses other seeds."""
        rng = random.Random(f"{split}:{seed}")
        return [
            {
                "id": f"{split}-{i}",
                "high": (high := rng.choice([8, 16, 32])),
                "secret": rng.randint(1, high),
            }
            for i in range(n)
        ]

    def example_task(self) -> dict:
        return {"id": "example", "high": 8, "secret": 5}
