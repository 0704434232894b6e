"""A forkable env for tree-rollout runs with the untrained tiny model (integration tests).

Retool with its sandbox started at the first turn: every step appends a line unique to
its branch to ``log.txt`` in the episode's sandbox, after checking the file holds exactly
the branch's own earlier lines (``info["log_ok"]``): a sandbox shared between branches, or
a fork that lost the parent's files, shows there. A turn ends on most tokens (a stage that
stops on ids 64..2047), so the untrained model's turns end within a few tokens instead of
being cut by the budget; an episode lasts three turns, rewarded by the last turn's length.
"""

from __future__ import annotations

import uuid
from typing import Any

from agentrl import Message, StepResult
from agentrl.envs.retool import RetoolEnv
from agentrl.rollout.stages import Stage
from agentrl.sandbox import LocalSandbox


class TreeLogEnv(RetoolEnv):
    preset = None
    max_turns = 3
    stages = (Stage(name="short", stop_token_ids=tuple(range(64, 2048))),)

    def __init__(self, *, workdir_root: str, **kw: Any) -> None:
        super().__init__(sandbox_factory=lambda: LocalSandbox(workdir_root=workdir_root), **kw)
        self.lines: list[str] = []
        self.log_ok = True

    @classmethod
    def run_resources(cls, **env_kwargs: Any) -> None:
        return None  # one sandbox of its own per episode (the factory), no pool

    async def step(self, action: Any) -> StepResult:
        seen = (await self.sandbox.exec("cat log.txt 2>/dev/null || true")).stdout
        self.log_ok = self.log_ok and seen == "".join(f"{x}\n" for x in self.lines)
        self.lines.append(f"{len(self.lines)}:{uuid.uuid4().hex[:8]}")
        await self.sandbox.write_file("log.txt", "".join(f"{x}\n" for x in self.lines))
        if len(self.lines) < self.max_turns:
            return StepResult(observation=[Message.user("go on")])
        info = {"log_ok": self.log_ok, "log_lines": len(self.lines)}
        return StepResult(reward=float(len(action.text) % 2), terminated=True, info=info)

    async def fork(self) -> TreeLogEnv:
        child = await super().fork()
        assert isinstance(child, TreeLogEnv)
        child.lines = list(self.lines)
        return child
