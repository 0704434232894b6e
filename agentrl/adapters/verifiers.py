"""VerifiersEnv: a `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ 0.4 taskset
(``verifiers.v1``) as an Env.

``agentrl train --env verifiers:ID`` trains on the taskset ``ID`` (a built-in one of
``verifiers.v1.tasksets`` or an installed taskset package, as ``vf-eval ID`` finds it),
natively: agentrl's own loop plays the agent, no verifiers harness runs. The tasks are the
taskset's ``load()`` (each row is its ``TaskData``, ``idx`` included); ``reset`` shows the
task's ``system_prompt`` and ``prompt``; the episode ends on a reply without tool calls (or
on the last turn), and the reward is what the task's ``@vf.reward`` methods give
(``task.score(trace)``, weighted and summed as verifiers sums them), its ``@vf.metric``
values the episode's metrics (``verifiers/NAME``).

Not run yet: tasksets whose tasks need tool servers (``toolsets``, MCP) or a container
(``NEEDS_CONTAINER``); such an ID is refused with that reason. Rewards that need a runtime
(a ``runtime`` parameter without default) are skipped by verifiers itself.

Example (with the ``verifiers`` extra)::

    Cls = verifiers_env_class("my-taskset")
    env = Cls()
    msgs = env.reset(Cls.example_task())
    result = asyncio.run(env.step(Action(text="4")))
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from agentrl.env import Env
from agentrl.types import Action, Message, StepResult

__all__ = ["INSTALL_HINT", "VerifiersEnv", "verifiers_env_class"]

INSTALL_HINT = "pip install 'agentrl[verifiers]'"
_MAX_TASKS = 100_000
"""How many tasks of an infinite taskset (``Taskset.INFINITE``) a run reads at most."""


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError(f"verifiers envs need the verifiers package: {INSTALL_HINT}") from e
    return vf


def _load_taskset(env_id: str) -> tuple[Any, Any]:
    """The taskset ``env_id`` (made with its own config class) and its tasks' State class.

    The one place that uses verifiers internals (``verifiers.v1.utils.loaders`` and
    ``verifiers.v1.state``, as of 0.4.0): they resolve an id to its taskset and config
    exactly as ``vf.load_environment`` does, without building the env's harness.
    """
    from verifiers.v1.state import state_cls
    from verifiers.v1.utils import loaders

    taskset = loaders.taskset_class(env_id)(loaders.taskset_config_type(env_id)(id=env_id))
    return taskset, state_cls(type(taskset).task_type())


class VerifiersEnv(Env):
    """One verifiers task per episode; subclasses made by :func:`verifiers_env_class` name
    the taskset (``verifiers_id``)."""

    name = "verifiers"
    verifiers_id: ClassVar[str] = ""

    def __init__(self) -> None:
        self.task: Any = None
        self.messages: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ tasks

    @classmethod
    def taskset(cls) -> Any:
        """The taskset, loaded once per process."""
        return _taskset(cls.verifiers_id)[0]

    @classmethod
    def all_tasks(cls) -> list[dict[str, Any]]:
        """Every task of the taskset as a row (its ``TaskData``), in ``load()`` order."""
        return list(_rows(cls.verifiers_id))

    @classmethod
    def default_tasks(
        cls, split: str = "train", n: int = 4096, seed: int = 0
    ) -> list[dict[str, Any]]:
        """verifiers tasksets have no splits: as for a task file, the first tenth of the
        tasks (at least one, when there are two or more) is ``test``, the rest ``train``;
        the first ``n`` of the split (``seed`` unused: the order is the taskset's)."""
        rows = cls.all_tasks()
        if not rows:
            raise LookupError(f"verifiers taskset {cls.verifiers_id!r} loaded no tasks")
        held = max(1, len(rows) // 10) if len(rows) > 1 else 0
        part = rows[:held] if split == "test" else rows[held:] or rows
        return part[:n]

    @classmethod
    def load_tasks(cls, path: str) -> list[dict[str, Any]]:
        """Rows of a ``.jsonl``, ``.json`` or ``.parquet`` file, each validated as the
        taskset's ``TaskData``; a bad row raises ValueError naming its line and field."""
        from pydantic import ValidationError

        data_type = type(cls.taskset()).task_type().data_type()
        out = []
        for where, row in _read(path):
            try:
                out.append(_row(data_type.model_validate(row)))
            except ValidationError as e:
                first = e.errors()[0]
                field = ".".join(map(str, first["loc"])) or "(row)"
                raise ValueError(
                    f"{path} ({where}): field {field!r}: {first['msg']} "
                    f"(taskset {cls.verifiers_id!r} reads rows as {data_type.__name__})"
                ) from e
        return out

    def example_task(self) -> Mapping[str, Any]:
        return self.default_tasks(split="train", n=1)[0]

    # ------------------------------------------------------------------ episode

    def reset(self, task: Mapping[str, Any], *, seed: int | None = None) -> list[Message]:
        """The task's system prompt and prompt (``seed`` unused)."""
        taskset = self.taskset()
        task_cls = type(taskset).task_type()
        data = task_cls.data_type().model_validate(dict(task))
        self.task = task_cls(data, taskset.config.task)
        self.messages = []
        if data.system_prompt:
            self.messages.append({"role": "system", "content": data.system_prompt})
        prompt = data.prompt
        if isinstance(prompt, str):
            self.messages.append({"role": "user", "content": prompt})
        else:
            self.messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        if not self.messages:
            raise ValueError(f"verifiers task {data.idx}: no prompt and no system prompt")
        return [_message(m) for m in self.messages]

    async def step(self, action: Action) -> StepResult:
        """A reply without tool calls (or the last turn) ends the episode and is scored."""
        if self.task is None:
            raise RuntimeError("VerifiersEnv.step before reset")
        self.messages.append(_assistant(action))
        self.messages += [
            {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
            for m in action.tool_results
        ]
        if (action.tool_calls or action.parse_errors) and not action.last_turn:
            return StepResult()
        trace = self._trace()
        await self.task.score(trace)
        scores = {k: r.score for k, r in trace.rewards.items() if r is not None}
        values = {**trace.metrics, **scores}
        metrics = {f"verifiers/{k}": float(v) for k, v in values.items() if v is not None}
        return StepResult(reward=float(trace.reward), terminated=True, metrics=metrics)

    def close(self) -> None:
        self.task = None

    def _trace(self) -> Any:
        """The episode as a verifiers Trace: one chain of message nodes."""
        vf = _vf()
        task = self.task
        state = _taskset(self.verifiers_id)[1]
        nodes = [
            vf.MessageNode(parent=i - 1 if i else None, message=m, sampled=m["role"] == "assistant")
            for i, m in enumerate(self.messages)
        ]
        info = vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash)
        return vf.Trace(
            task=info,
            agent=vf.AgentInfo(config=vf.AgentConfig(), name="agentrl"),
            nodes=nodes,
            state=state(),
            is_completed=True,
            ok=True,
        )


@functools.cache
def _taskset(env_id: str) -> tuple[Any, Any]:
    _vf()
    return _load_taskset(env_id)


@functools.cache
def _rows(env_id: str) -> tuple[dict[str, Any], ...]:
    taskset = _taskset(env_id)[0]
    view = taskset if taskset.bounded else taskset.take(_MAX_TASKS)
    return tuple(_row(t.data) for t in view)


def _read(path: str) -> list[tuple[str, Any]]:
    """The rows of a task file, each with where it is (``line N`` or ``row N``)."""
    p = Path(path)
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"row {i}", r) for i, r in enumerate(pq.read_table(p).to_pylist())]
    text = p.read_text()
    try:
        if p.suffix == ".json":
            rows = json.loads(text)
            if not isinstance(rows, list):
                raise ValueError(f"{path}: a .json task file holds a list of rows")
            return [(f"row {i}", r) for i, r in enumerate(rows)]
        lines = enumerate(text.splitlines(), 1)
        return [(f"line {n}", json.loads(line)) for n, line in lines if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e


def _row(data: Any) -> dict[str, Any]:
    return dict(data.model_dump(mode="json", exclude_defaults=True))


def _message(m: Mapping[str, Any]) -> Message:
    content = m.get("content") or ""
    if not isinstance(content, str):  # content parts: the text ones
        content = "\n\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return Message(str(m["role"]), content)


def _assistant(action: Action) -> dict[str, Any]:
    calls = [
        {"id": c.id or f"call_{i}", "name": c.name, "arguments": json.dumps(c.arguments)}
        for i, c in enumerate(action.tool_calls)
    ]
    out: dict[str, Any] = {"role": "assistant", "content": action.content or action.text}
    if calls:
        out["tool_calls"] = calls
    return out


def verifiers_env_class(env_id: str) -> type[VerifiersEnv]:
    """A VerifiersEnv subclass for the taskset ``env_id`` (what ``--env verifiers:ID`` resolves
    to); made with no arguments.

    Raises:
        ImportError: verifiers is not installed (the message says how to install it).
        LookupError: No taskset ``env_id``, or one whose tasks need what the adapter does not
            run yet (tool servers, a container).
    """
    _vf()
    try:
        taskset = _taskset(env_id)[0]
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise LookupError(f"no verifiers taskset {env_id!r}: {e}") from e
    task_cls = type(taskset).task_type()
    servers = [*type(taskset).toolsets(taskset.config), *task_cls.toolsets(taskset.config.task)]
    if servers:
        names = ", ".join(type(s).__name__ for s in servers)
        raise LookupError(
            f"verifiers taskset {env_id!r} declares tool servers ({names}); agentrl's verifiers "
            "adapter does not run MCP toolsets yet"
        )
    if task_cls.NEEDS_CONTAINER:
        raise LookupError(
            f"verifiers taskset {env_id!r}: its tasks need a container (NEEDS_CONTAINER), "
            "which agentrl's verifiers adapter does not provide yet"
        )
    safe = re.sub(r"\W", "_", env_id)
    attrs = {"verifiers_id": env_id, "name": f"verifiers:{env_id}", "__module__": __name__}
    return type(f"Verifiers_{safe}", (VerifiersEnv,), attrs)
