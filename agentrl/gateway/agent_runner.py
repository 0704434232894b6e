"""Runs bring-your-own agents: one ``solve(task, client)`` per episode, each behind its own session.

The agent contract::

    async def solve(task: dict, client: openai.AsyncOpenAI) -> float | None
    def solve(task: dict, client: openai.OpenAI) -> float | None  # sync: in a worker thread

``solve`` returns the reward, or None to let a scorer give it:
``score(task, messages) -> float`` (sync or async), where ``messages`` is the
last conversation the agent sent, with the model's final reply appended
(OpenAI dicts, whichever API the agent used). The client fits ``solve``: an
``openai`` client (async for an ``async def``, sync for a plain ``def``), or an
``anthropic`` one (``AsyncAnthropic`` / ``Anthropic``) when the ``client``
parameter is annotated with an Anthropic client class. ``solve`` may add metrics and
info to its episode's Trajectory with :func:`agentrl.reporting.episode.report_episode`.
Whatever the agent does, its episode ends with a reason and never takes the run down:
an agent that raises ends with ``agent_error`` and its traceback, one that hangs is cut at
``episode_timeout_s`` (``timeout``; a sync one's thread is left to end on its
own: its session is closed, so its next request fails).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentrl.env import call_maybe_async
from agentrl.gateway.server import Gateway, redact_token
from agentrl.gateway.transport import in_process_client, in_process_sync_client
from agentrl.loading.modules import import_file
from agentrl.reporting.episode import EpisodeReport, collect_episode_report
from agentrl.rollout.runner import RolloutResult, summarize
from agentrl.runtime.threads import in_daemon_thread
from agentrl.types import StopReason, Trajectory

__all__ = ["AgentRunner", "AgentSpecError", "client_kind", "load_agent"]

Solve = Callable[[dict[str, Any], Any], Awaitable[float | None] | float | None]
Score = Callable[[dict[str, Any], list[dict[str, Any]]], Any]

# The gateway's own failures explain an agent's exception better than the exception does.
_GATEWAY_REASONS = {StopReason.LLM_ERROR, StopReason.INTERNAL_ERROR}


class AgentSpecError(ValueError):
    """An agent spec (``file.py:solve`` / ``pkg.module:solve``) cannot be loaded."""


def _module(where: str, spec: str) -> Any:
    if where.endswith(".py") or "/" in where or "\\" in where:
        return import_file(where, spec, kind="agent", error=AgentSpecError)
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        raise AgentSpecError(f"agent spec {spec!r}: no module named {e.name!r}") from e


def _load(spec: str, what: str) -> tuple[Any, Callable[..., Any]]:
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise AgentSpecError(
            f"bad {what} spec {spec!r}: expected 'path/to/file.py:{what}' or 'pkg.module:{what}'"
        )
    module = _module(where, spec)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AgentSpecError(f"{what} spec {spec!r}: {where} has no callable {attr!r}")
    return module, fn


def _is_async(fn: Any) -> bool:
    # A callable object's async __call__ counts too.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def client_kind(solve: Callable[..., Any]) -> tuple[str, bool]:
    """(SDK, async) of the client ``solve`` gets: "anthropic" when its ``client``
    parameter is annotated with an Anthropic client class, else "openai"; async for an
    ``async def`` (or an object with an async ``__call__``)."""
    try:
        params = list(inspect.signature(solve).parameters.values())
    except (TypeError, ValueError):
        params = []
    ann = params[1].annotation if len(params) > 1 else inspect.Parameter.empty
    text = ann if isinstance(ann, str) else f"{getattr(ann, '__module__', '')}.{ann!r}"
    return ("anthropic" if "Anthropic" in text else "openai"), _is_async(solve)


def load_agent(spec: str, score: str | None = None) -> tuple[Solve, Score | None]:
    """Loads ``solve`` (async, or sync: run in a worker thread) and its scorer: ``score``
    if given, else a ``score`` beside ``solve``.

    Raises:
        AgentSpecError: The spec is malformed, the file or module is missing, or
            ``solve`` asks for an Anthropic client and ``anthropic`` is not installed.
    """
    module, solve = _load(spec, "solve")
    kind, _ = client_kind(solve)
    if kind == "anthropic" and importlib.util.find_spec("anthropic") is None:
        raise AgentSpecError(
            f"agent {spec!r} takes an Anthropic client, and the anthropic package is not "
            "installed (pip install anthropic)"
        )
    scorer = _load(score, "score")[1] if score else getattr(module, "score", None)
    return solve, scorer if callable(scorer) else None


def _task_id(task: Mapping[str, Any], index: int) -> str:
    for key in ("id", "task_id", "uid"):
        if key in task:
            return str(task[key])
    return str(index)


def _reward(value: Any) -> float:
    if isinstance(value, int | float):  # bool is an int
        return float(value)
    raise TypeError(f"the reward must be a number, got {type(value).__name__}: {value!r}")


class AgentRunner:
    """Runs G agent episodes per task through the gateway (a GroupRunner for the Driver).

    Args:
        gateway: A started :class:`Gateway`.
        solve: ``async def solve(task, client) -> float | None``, or a sync ``def``
            (run in a thread of its own, with a sync client).
        score: ``score(task, messages) -> float`` for episodes whose solve returns None.
        group_size: Episodes per task (G of GRPO).
        max_concurrency: Most episodes in flight.
        episode_timeout_s: Wall-clock budget of one episode (solve and scoring).
        request_timeout_s: Timeout of one HTTP request of the agent's client.
        transport: How the agent's client reaches its session: "in_process" (its
            requests are handed to the gateway's handler without a socket; the same
            bodies and errors, a fraction of the CPU; a sync client's are handed to the
            gateway's event loop) or "http" (over 127.0.0.1).
    """

    def __init__(
        self,
        gateway: Gateway,
        solve: Solve,
        *,
        score: Score | None = None,
        group_size: int = 1,
        max_concurrency: int = 64,
        episode_timeout_s: float = 600.0,
        request_timeout_s: float = 600.0,
        transport: str = "in_process",
    ) -> None:
        if group_size < 1 or max_concurrency < 1:
            raise ValueError("group_size and max_concurrency must be ≥ 1")
        if transport not in ("in_process", "http"):
            raise ValueError(f"transport must be 'in_process' or 'http', got {transport!r}")
        self.transport = transport
        self.gateway = gateway
        self.solve = solve
        self._kind = client_kind(solve)
        self.score = score
        self.group_size = group_size
        self.episode_timeout_s = episode_timeout_s
        self.request_timeout_s = request_timeout_s
        self._sem = asyncio.Semaphore(max_concurrency)

    def _client(self, session: Any) -> Any:
        """The episode's client: the SDK and sync/async ``solve`` asks for, on its session."""
        kind, is_async = self._kind
        sdk = importlib.import_module(kind)
        if kind == "anthropic":
            base_url = self.gateway.anthropic_base_url(session)
            cls = sdk.AsyncAnthropic if is_async else sdk.Anthropic
        else:
            base_url = self.gateway.base_url(session)
            cls = sdk.AsyncOpenAI if is_async else sdk.OpenAI
        if self.transport == "in_process":
            if is_async:
                http_client = in_process_client(self.gateway, sdk=sdk)
            else:
                loop = asyncio.get_running_loop()
                http_client = in_process_sync_client(self.gateway, loop, sdk=sdk)
        else:  # plain HTTP to the gateway: no TLS context (loading the CA bundle costs
            # ~35 ms per client, more than an episode's requests)
            http_cls = sdk.DefaultAsyncHttpxClient if is_async else sdk.DefaultHttpxClient
            http_client = http_cls(verify=False)
        return cls(
            base_url=base_url, api_key="agentrl", max_retries=0,
            timeout=self.request_timeout_s, http_client=http_client,
        )  # fmt: skip

    async def _solve(self, task: dict[str, Any], client: Any, episode_id: str) -> Any:
        """``solve``'s result: awaited, or (sync) from a worker thread of its own."""
        if self._kind[1]:
            return await self.solve(task, client)  # type: ignore[misc]
        solve = self.solve
        result = await in_daemon_thread(
            lambda: solve(task, client), name=f"agentrl-solve-{episode_id}"
        )
        return await result if inspect.isawaitable(result) else result

    async def _close(self, client: Any) -> None:
        closed = client.close()
        if inspect.isawaitable(closed):
            await closed

    async def run_episode(
        self, task: Mapping[str, Any], *, task_id: str = "0", group_id: str = "0",
        episode_id: str = "0",
    ) -> Trajectory:  # fmt: skip
        """Runs one episode and returns its Trajectory (never raises for it)."""
        session = self.gateway.open_session(episode_id)
        client = self._client(session)
        t0 = time.perf_counter()
        reward, error = 0.0, None
        reason = StopReason.DONE
        deadline = asyncio.timeout(self.episode_timeout_s)
        report = EpisodeReport()
        try:
            async with deadline:
                with collect_episode_report() as report:
                    result = await self._solve(dict(task), client, episode_id)
                if result is None:
                    if self.score is None:
                        raise TypeError(
                            "solve returned None and the agent has no scorer: return the "
                            "reward, or define score(task, messages) beside solve"
                        )
                    result = await call_maybe_async(
                        self.score, dict(task), list(session.conversation)
                    )
                reward = _reward(result)
            reason = session.stop_reason or StopReason.DONE
            error = session.error
        except asyncio.CancelledError:
            self.gateway.close_session(session)
            await self._close(client)
            raise
        except Exception:
            if deadline.expired():
                reason, error = StopReason.TIMEOUT, f"episode exceeded {self.episode_timeout_s}s"
            elif session.stop_reason is not None and (
                session.stop_reason in _GATEWAY_REASONS or session.fatal
            ):  # the gateway ended the episode; the agent's error follows from it
                reason = session.stop_reason
                error = f"{session.error}\n\nthe agent then raised:\n{traceback.format_exc()}"
            elif session.cut_by_budget:  # e.g. openai-agents raises on an incomplete reply
                reason = StopReason.MAX_TOKENS
                error = (
                    "the agent raised after its last reply was cut by the run's token budget "
                    "(rollout.max_tokens_per_turn / rollout.max_total_tokens): the episode "
                    f"ends as max_tokens, reward 0\n\n{traceback.format_exc()}"
                )
            else:
                reason, error = StopReason.AGENT_ERROR, traceback.format_exc()
        finally:
            self.gateway.close_session(session)
            await self._close(client)
        if error:  # an agent's traceback may quote its base URL: the token stays secret
            error = redact_token(error)
        traj = session.trajectory(
            task_id=task_id, group_id=group_id, reward=reward, stop_reason=reason, error=error
        )
        traj.metrics.update(report.metrics)
        traj.info.update(report.info)
        traj.metrics["episode_time_s"] = time.perf_counter() - t0
        if session.last_api_error:
            traj.info["last_api_error"] = redact_token(session.last_api_error)
        return traj

    async def _episode(
        self, task: Mapping[str, Any], task_id: str, group_id: str, k: int
    ) -> Trajectory:
        async with self._sem:
            return await self.run_episode(
                task, task_id=task_id, group_id=group_id, episode_id=f"{group_id}/{k}"
            )

    async def run_group(
        self, task: Mapping[str, Any], *, index: int, seed: int | None = 0, tag: str = ""
    ) -> list[Trajectory]:
        """The G episodes of one task (a rewritten history's segments are samples of one)."""
        tid = _task_id(task, index)
        group_id = f"{tag or uuid.uuid4().hex[:8]}:{index}:{tid}"
        return list(
            await asyncio.gather(
                *(self._episode(task, tid, group_id, k) for k in range(self.group_size))
            )
        )

    async def run(
        self, tasks: Sequence[Mapping[str, Any]], *, seed: int | None = 0
    ) -> RolloutResult:
        """Every task's group, in task order, with aggregate metrics (as RolloutRunner.run)."""
        batch = uuid.uuid4().hex[:8]
        groups = await asyncio.gather(
            *(self.run_group(t, index=i, seed=seed, tag=batch) for i, t in enumerate(tasks))
        )
        return summarize(list(groups))
