"""SweEnv (``--env swe``): fix a repository's issue with bash and a file editor, then submit.

An episode: ``reset`` gets a container (from a pool, or a fresh one), puts the task's
snapshot in ``/workspace/repo`` as a new one-commit git repository (no hidden tests, no
other history) and returns the issue. The agent calls ``bash``, ``str_replace_editor``
and ``submit``. On ``submit`` the env grades the repository's diff in a fresh container
(:class:`~envs.swe.grader.Grader`) and ends the episode with its reward.

A turn without tool calls gets a reminder to use the tools; after ``max_idle_turns``
such turns in a row, or at the env's own turn limit, the current diff is graded as if
submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agentrl.env import Env
from agentrl.loading.envs import register_env
from agentrl.sandbox.base import SandboxError, SandboxLimits
from agentrl.sandbox.docker import DockerSandbox
from agentrl.sandbox.docker_pool import DockerSandboxPool
from agentrl.tools import tool
from agentrl.types import Action, Message, StepResult

from .admission import admit, check_size
from .editor import Editor
from .fork import fork_episode
from .grader import Grader, GradeResult
from .ladder import Level, generate_tasks
from .loader import as_task, builtin_tasks, load_tasks
from .outcome import graded_step, run_pools
from .task import SweTask
from .worked import worked_example_messages
from .workspace import (
    REPO_DIR,
    SandboxFS,
    WorkspaceError,
    git_diff,
    init_git,
    install_snapshot,
    lost,
)

__all__ = ["AGENT_LIMITS", "SYSTEM_PROMPT", "SweEnv"]

AGENT_LIMITS = SandboxLimits(
    wall_timeout_s=60,
    cpu_time_s=600,
    memory_mb=1024,
    max_processes=128,
    max_file_size_mb=64,
    max_disk_mb=512,
    max_output_bytes=1 << 20,
)

SYSTEM_PROMPT = f"""You are a software engineer fixing an issue in a Python repository at \
{REPO_DIR}.
Tools: `bash` runs a shell command in the repository (each call starts fresh in {REPO_DIR}); \
`str_replace_editor` views, creates and edits files (paths inside {REPO_DIR}); `submit` \
ends the task and your changes are graded by tests you cannot see.
Find the cause, change the code to fix it, check your fix, then call `submit`."""

NUDGE = (
    "Use the tools (bash, str_replace_editor) to work on the issue, and call `submit` when done."
)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n…[{len(text) - limit} characters cut]…\n{text[-half:]}"


@register_env("swe")
class SweEnv(Env):
    """SWE-style code-agent env (see the module docstring and docs/swe.md).

    Args:
        tasks: Tasks a row ``{"id": ...}`` may name (default: the built-in set); a full
            inline row works without them.
        sandbox_pool: Lend the agent's container from this pool (tasks without an image).
        grader: The grader (default: a :class:`Grader` with fresh containers).
        image: Image for tasks that name none (None: agentrl/python).
        limits: Limits of the agent's container.
        bash_timeout_s: Default and maximum wall clock of one ``bash`` call.
        max_output_chars: Tool output beyond this is cut in the middle.
        max_idle_turns: Turns in a row without a tool call before the diff is graded.
        system_prompt: The system message.
        worked_examples: 1 shows a solved episode (view, edit, test, submit) before the
            task, for a model that must learn the tool format (see ``envs/swe/worked.py``).
        sandbox_pool_size: A training run lends the agents' containers from one warm pool
            of this many (fresh per episode, started in the background); 0: one started
            per episode.
        grader_pool_size: A training run grades in fresh containers from a warm pool of
            this many; 0: one started per grading.
    """

    name = "swe"
    max_turns = 30
    forkable = True  # fork(): the child gets a fork of the agent's container
    _lost: str | None = None  # why the agent's container failed in this episode

    def __init__(
        self,
        *,
        tasks: Sequence[SweTask] | None = None,
        sandbox_pool: DockerSandboxPool | None = None,
        grader: Grader | None = None,
        image: str | None = None,
        limits: SandboxLimits = AGENT_LIMITS,
        bash_timeout_s: float = 30.0,
        max_output_chars: int = 8000,
        max_idle_turns: int = 2,
        system_prompt: str = SYSTEM_PROMPT,
        worked_examples: int = 0,
        sandbox_pool_size: int = 0,
        grader_pool_size: int = 0,
    ) -> None:
        if sandbox_pool_size < 0 or grader_pool_size < 0:
            raise ValueError("sandbox_pool_size and grader_pool_size must be >= 0")
        self._examples = worked_example_messages(worked_examples, self._issue_text)
        self._tasks = tasks
        self.pool = sandbox_pool
        self.grader = grader or Grader(image=image)
        self.image = image
        self.limits = limits
        self.bash_timeout_s = bash_timeout_s
        self.max_output_chars = max_output_chars
        self.max_idle_turns = max_idle_turns
        self.system_prompt = system_prompt
        self.task: SweTask | None = None
        self.sandbox: DockerSandbox | None = None
        self._from_pool = False
        self._editor: Editor | None = None
        self._base = ""
        self._lock = asyncio.Lock()
        self._submitted = False
        self._turns = 0
        self._idle = 0
        self.last_grade: GradeResult | None = None
        self.last_patch = ""

    @classmethod
    def run_resources(
        cls,
        *,
        sandbox_pool: DockerSandboxPool | None = None,
        grader: Grader | None = None,
        image: str | None = None,
        limits: SandboxLimits = AGENT_LIMITS,
        sandbox_pool_size: int = 0,
        grader_pool_size: int = 0,
        **_: Any,
    ) -> contextlib.AbstractAsyncContextManager[dict[str, Any]] | None:
        """The run's warm pools: agents' containers (``sandbox_pool_size``) and grading
        containers (``grader_pool_size``), both fresh per lease, removed with the run."""
        agent = sandbox_pool is None and sandbox_pool_size > 0
        grading = grader is None and grader_pool_size > 0
        if not (agent or grading):
            return None
        return run_pools(
            image, limits, sandbox_pool_size if agent else 0, grader_pool_size if grading else 0
        )

    @classmethod
    def preflight(cls, image: str | None = None, **_: Any) -> None:
        """Fails at a run's start-up, naming the cause, when no Docker engine answers or
        the sandbox image cannot be built (``agentrl train`` calls this once)."""
        from agentrl.sandbox.images import docker_client, ensure_image

        docker_client()
        if image is None:
            ensure_image("python")

    # ------------------------------------------------------------------ tasks
    @staticmethod
    def default_tasks(
        split: str = "train", n: int | None = None, seed: int = 0, level: str = "standard"
    ) -> list[dict[str, Any]]:
        """Tasks as inline rows. ``level="standard"``: the built-in set, every 5th held out
        as ``"test"`` (``seed`` unused); ``"tiny"`` / ``"small"``: generated tasks (see
        :mod:`agentrl.envs.swe.ladder`; ``seed`` picks the split)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if Level(level) is not Level.STANDARD:
            return [t.to_row() for t in generate_tasks(split, seed=seed, level=level, n=n)]
        tasks = builtin_tasks()
        rows = [t.to_row() for i, t in enumerate(tasks) if (i % 5 == 4) == (split == "test")]
        return rows if n is None else rows[:n]

    @staticmethod
    def load_tasks(path: str, validate: bool | None = None) -> list[dict[str, Any]]:
        """Rows of a task file or folder (:func:`~envs.swe.loader.load_tasks`), admitted
        to a run (:func:`~envs.swe.admission.admit`): each snapshot within half of
        ``AGENT_LIMITS.max_disk_mb``, and with ``validate`` (default: unless
        ``AGENTRL_SWE_VALIDATE=0``) each task validated by the grader, once per content.

        Raises:
            TaskFormatError: A malformed or too large task, or tasks that fail validation
                (every bad id named).
        """
        tasks = admit(load_tasks(path), max_disk_mb=AGENT_LIMITS.max_disk_mb, validate=validate)
        return [t.to_row() for t in tasks]

    def example_task(self) -> dict[str, Any]:
        """One built-in task, for ``agentrl.testing.check_env``."""
        return builtin_tasks()[0].to_row()

    # ------------------------------------------------------------------ episode
    async def reset(self, task: Mapping[str, Any], *, seed: int | None = None) -> list[Message]:
        """Sets up the task's repository in a container and returns the issue.

        Raises:
            TaskFormatError: The task row is malformed or names an unknown task.
            WorkspaceError: The snapshot could not be installed (a broken task or image).
        """
        known = self._tasks if self._tasks is not None else builtin_tasks()
        parsed = as_task(task, known)
        check_size(parsed, self.limits.max_disk_mb)
        await self._release()
        self.task, self._submitted, self._turns, self._idle = parsed, False, 0, 0
        self.last_grade, self.last_patch, self._lost = None, "", None
        try:
            self.sandbox = await self._acquire(parsed)
        except SandboxError as e:
            raise await lost("starting the agent's container", e) from e
        await install_snapshot(self.sandbox, parsed)
        self._base = await init_git(self.sandbox)
        self._editor = Editor(SandboxFS(self.sandbox), REPO_DIR)
        prompt = self._issue_text(parsed.issue, parsed.visible_tests)
        return [Message.system(self.system_prompt), *self._examples, Message.user(prompt)]

    @staticmethod
    def _issue_text(issue: str, visible_tests: Sequence[str]) -> str:
        text = f"Fix this issue in the repository at {REPO_DIR}.\n\n"
        text += f"<issue>\n{issue.strip()}\n</issue>"
        if visible_tests:
            text += "\n\nTests you can run: " + ", ".join(visible_tests)
        return text

    async def _acquire(self, task: SweTask) -> DockerSandbox:
        if self.pool is not None and task.image is None:
            self._from_pool = True
            return await self.pool.acquire()
        self._from_pool = False
        sb = DockerSandbox(task.image or self.image, self.limits)
        await sb.start()
        return sb

    async def _release(self) -> None:
        sb, self.sandbox, self._editor = self.sandbox, None, None
        if sb is None:
            return
        if self._from_pool and self.pool is not None:
            await self.pool.release(sb)
        else:
            await sb.close()

    async def close(self) -> None:
        """Gives the agent's container back (or removes it)."""
        await self._release()

    async def fork(self) -> SweEnv:
        """This episode now, with its own fork of the container (:mod:`.fork`)."""
        return await fork_episode(self)

    def _require(self) -> tuple[DockerSandbox, Editor]:
        if self.sandbox is None or self._editor is None:
            raise RuntimeError("no episode is running: call reset() first")
        return self.sandbox, self._editor

    # ------------------------------------------------------------------ tools
    def tools(self) -> Sequence[Any]:
        return [self.bash, self.str_replace_editor, self.submit]

    @tool
    async def bash(self, command: str, timeout_s: float | None = None) -> str:
        """Runs a bash command in the repository and returns its output and exit code.

        Args:
            command: The command (runs in /workspace/repo; no network).
            timeout_s: Seconds before it is killed (default and maximum: the env's limit).
        """
        sb, _ = self._require()
        limit = self.bash_timeout_s
        if timeout_s is not None:
            limit = min(max(timeout_s, 1.0), limit)
        async with self._lock:
            try:
                res = await sb.exec(
                    ["bash", "-c", f"cd {REPO_DIR} || exit 1\nexec 2>&1\n{command}"],
                    timeout_s=limit,
                )
            except SandboxError as e:
                self._lost = str(e)
                raise
            if res.exit_code in (137, -9) and not res.timed_out and not await sb.healthy():
                self._lost = f"a command was killed (exit {res.exit_code}), then it did not answer"
        out = _cut(res.stdout + res.stderr, self.max_output_chars)
        if res.timed_out:
            return f"{out}\n[killed: timed out after {limit:g}s]"
        return out if res.exit_code == 0 else f"{out}\n[exit code {res.exit_code}]"

    @tool
    async def str_replace_editor(
        self,
        command: Literal["view", "create", "str_replace", "insert", "undo_edit"],
        path: str,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: list[int] | None = None,
    ) -> str:
        """Views, creates and edits files of the repository.

        `view` shows a file with line numbers (or a directory's entries); `create` writes a
        new file; `str_replace` replaces old_str, which must occur exactly once; `insert`
        adds new_str after line insert_line; `undo_edit` reverts the last edit of a file.

        Args:
            command: view, create, str_replace, insert or undo_edit.
            path: File or directory, absolute or relative to /workspace/repo.
            file_text: Content of the new file (create).
            old_str: Exact text to replace (str_replace).
            new_str: Replacement text (str_replace) or text to insert (insert).
            insert_line: Line after which new_str goes; 0 inserts at the top (insert).
            view_range: [start, end] lines to show, 1-based; end -1 means to the end (view).
        """
        _, editor = self._require()
        async with self._lock:
            try:
                out = await editor.run(
                    command, path, file_text=file_text, old_str=old_str, new_str=new_str,
                    insert_line=insert_line, view_range=view_range,
                )  # fmt: skip
            except SandboxError as e:
                self._lost = str(e)
                raise
        return _cut(out, self.max_output_chars)

    @tool
    async def submit(self) -> str:
        """Ends the task: your changes to the repository are graded by hidden tests."""
        self._require()
        self._submitted = True
        return "Submitted; your changes will be graded."

    # ------------------------------------------------------------------ steps
    async def grade(self) -> GradeResult:
        """Grades the repository's current diff (what ``submit`` does)."""
        sb, _ = self._require()
        assert self.task is not None
        async with self._lock:
            try:
                self.last_patch = await git_diff(sb, self._base)
            except SandboxError as e:
                raise await lost("the agent's container", e) from e
            except WorkspaceError as e:
                if not await sb.healthy():  # not the agent's doing: no reward 0 for it
                    raise await lost("the agent's container", e) from e
                return GradeResult(0.0, False, False, detail=f"no diff: {e}")
        try:
            return await self.grader.grade(self.task, self.last_patch)
        except SandboxError as e:
            raise await lost("a grading container", e) from e

    async def step(self, action: Action) -> StepResult:
        """Grades on ``submit`` (or when the agent stops using tools / the turns run out).

        Raises:
            SandboxLostError: The agent's container (or the engine) died: the episode ends
                as an env error, discarded, instead of graded 0.
        """
        if self._lost is not None or (self.sandbox is not None and self.sandbox.dead):
            raise await lost("the agent's container", self._lost or "it is marked dead")
        self._turns += 1
        if not action.tool_calls and not action.parse_errors:
            self._idle += 1
        else:
            self._idle = 0
        ended = (
            "submit" if self._submitted
            else "no_tool_calls" if self._idle > self.max_idle_turns
            else "turn_limit" if self._turns >= self.max_turns or action.last_turn
            else None
        )  # fmt: skip
        if ended is None:
            nudge = [Message.user(NUDGE)] if self._idle else []
            return StepResult(observation=nudge)
        return await self.finish(ended)

    async def finish(self, ended_by: str) -> StepResult:
        """Grades the repository's current diff: the episode's last StepResult (reward,
        ``swe_*`` metrics and info; ``swe_ended_by`` is ``ended_by``)."""
        result = await self.grade()
        self.last_grade = result
        task_id = self.task.id if self.task else ""
        return graded_step(result, self.last_patch, task_id, ended_by, self.pool)
