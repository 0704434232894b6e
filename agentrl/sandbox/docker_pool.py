"""DockerSandboxPool: warm Docker sandboxes handed out in milliseconds, never reused dirty.

The pool keeps ``size`` containers (warm + leased + being created). ``acquire()`` admits at
most ``size`` leases at once and hands out a warm container without touching the engine.
Past capacity, acquirers queue: at most ``max_waiting`` of them, each for at most
``acquire_timeout_s``; one past either bound gets one :class:`PoolCapacityError` naming
the setting to raise. ``release()`` either replaces the container by
a fresh one prepared in the background (``reuse="replace"``, the default: nothing an
episode did can leak into the next) or kills all its processes and empties its work
directories before reuse (``reuse="reset"``, faster to recycle). A container that died, hung
(failed a health check) or failed to reset is removed and replaced. ``resize()`` follows the
rollout concurrency. At start, containers left behind by a killed run are reaped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, Self

from agentrl.sandbox.base import ExecResult, SandboxError, SandboxLimits
from agentrl.sandbox.docker import DockerSandbox, reap_orphans

__all__ = ["DockerSandboxPool", "PoolCapacityError", "PoolWaitTimeout"]

_DEFAULT_LIMITS = SandboxLimits()
_FATAL_AFTER = 3  # consecutive start failures with nothing alive: acquirers get the error


class PoolCapacityError(SandboxError):
    """No sandbox for an acquire: ``max_waiting`` acquirers already wait (the message
    names the setting to raise)."""


class PoolWaitTimeout(PoolCapacityError, TimeoutError):
    """No sandbox became free within the acquire's wait (``acquire_timeout_s``)."""


def _pct(values: collections.deque[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


class DockerSandboxPool:
    """A bounded pool of warm :class:`DockerSandbox` containers.

    Args:
        size: Containers kept (warm + leased); the most leases at once.
        image: Image tag for every sandbox (None: ``agentrl/python``).
        limits: Limits of every sandbox.
        reuse: ``"replace"`` (fresh container per lease) or ``"reset"`` (wipe and reuse).
        health_interval_s: How often warm containers are checked (0 disables the monitor).
        max_concurrent_starts: Containers created at once (keeps the engine responsive).
        max_waiting: Acquirers that may wait at once while all ``size`` are leased (or
            being prepared); one more gets :class:`PoolCapacityError` at once, naming this
            setting. A queue, not a failure: waiting acquirers get a sandbox as leases
            return.
        acquire_timeout_s: How long an ``acquire`` waits at most (finite); past it,
            :class:`PoolWaitTimeout` (a ``TimeoutError``) naming this setting.
        reap: Remove orphaned sandbox containers of dead processes at start.
        factory: Makes one unstarted sandbox (tests, custom options); ``sandbox_kwargs`` are
            passed to :class:`DockerSandbox` otherwise.
    """

    def __init__(
        self,
        size: int,
        image: str | None = None,
        limits: SandboxLimits = _DEFAULT_LIMITS,
        *,
        reuse: Literal["replace", "reset"] = "replace",
        health_interval_s: float = 30.0,
        max_concurrent_starts: int = 2,
        max_waiting: int = 1024,
        acquire_timeout_s: float = 120.0,
        reap: bool = True,
        factory: Callable[[], DockerSandbox] | None = None,
        **sandbox_kwargs: Any,
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        if not 0 < acquire_timeout_s < float("inf"):
            raise ValueError(
                f"acquire_timeout_s must be positive and finite, got {acquire_timeout_s}"
            )
        self.size = size
        self.max_waiting = max_waiting
        self.acquire_timeout_s = acquire_timeout_s
        self.reuse = reuse
        self.health_interval_s = health_interval_s
        self._reap = reap
        self._factory = factory or (
            lambda: DockerSandbox(image, limits, on_exec=self._record_exec, **sandbox_kwargs)
        )
        self._warm: collections.deque[DockerSandbox] = collections.deque()
        self._leased: set[DockerSandbox] = set()
        self._retiring: set[DockerSandbox] = set()  # being closed; close() waits for them
        self._starting: set[DockerSandbox] = set()
        self._creating = 0
        self._starts = asyncio.Semaphore(max_concurrent_starts)
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._started = False
        self._fail_streak = 0
        self._last_error: BaseException | None = None
        self._acquire_s: collections.deque[float] = collections.deque(maxlen=10_000)
        self._exec_s: collections.deque[float] = collections.deque(maxlen=10_000)
        self._start_s: collections.deque[float] = collections.deque(maxlen=1_000)
        self._wait_s: collections.deque[float] = collections.deque(maxlen=10_000)
        self.failures = 0
        self.replaced = 0
        self.waiting = 0  # acquirers queued now
        self.queued = 0  # acquires that had to wait for a sandbox
        self.refused = 0  # acquires refused: max_waiting already queued
        self.wait_timeouts = 0  # acquires that waited acquire_timeout_s in vain

    # ---------------------------------------------------------------- lifecycle
    async def start(self, *, wait: bool = True) -> None:
        """Reaps orphans, then fills the pool (waiting for it to be warm unless ``wait=False``)."""
        if self._started:
            return
        self._started = True
        if self._reap:
            await asyncio.get_running_loop().run_in_executor(None, reap_orphans)
        self._fill()
        if self.health_interval_s > 0:
            self._spawn(self._monitor())
        if wait:
            await self.wait_warm()

    async def wait_warm(self, timeout_s: float = 300.0) -> None:
        """Waits until every slot not leased holds a warm container."""
        async with asyncio.timeout(timeout_s), self._cond:
            await self._cond.wait_for(
                lambda: self._fatal() or len(self._warm) + len(self._leased) >= self.size
            )
        self._raise_if_fatal()

    async def close(self) -> None:
        """Removes every container (leased ones too); idempotent."""
        if self._closed:
            return
        self._closed = True
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        boxes = [*self._warm, *self._leased, *self._retiring, *self._starting]
        self._warm.clear()
        self._leased.clear()
        await asyncio.gather(*(sb.close() for sb in boxes), return_exceptions=True)
        async with self._cond:
            self._cond.notify_all()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def resize(self, size: int) -> None:
        """Sets the pool size (e.g. to the rollout concurrency); extra warm ones are removed."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        extra: list[DockerSandbox] = []
        while self._warm and len(self._warm) + len(self._leased) + self._creating > size:
            extra.append(self._warm.pop())
        for sb in extra:
            self._retire(sb)
        self._fill()
        async with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------- leases
    async def acquire(self, timeout_s: float | None = None) -> DockerSandbox:
        """A warm sandbox for one episode; queues while ``size`` are leased.

        Args:
            timeout_s: The longest wait (None: the pool's ``acquire_timeout_s``).

        Raises:
            PoolCapacityError: ``max_waiting`` acquirers already wait.
            PoolWaitTimeout: None became free within the wait (a ``TimeoutError``).
            SandboxError: The pool is closed, or containers keep failing to start.
        """
        if not self._started:
            await self.start(wait=False)
        wait_s = self.acquire_timeout_s if timeout_s is None else timeout_s
        t0 = time.perf_counter()
        queued = False
        try:
            async with asyncio.timeout(wait_s), self._cond:
                while True:
                    if not self._ready():
                        if not queued:
                            self._enqueue()
                            queued = True
                        await self._cond.wait_for(self._ready)
                    if self._closed:
                        raise SandboxError("sandbox pool is closed")
                    self._raise_if_fatal()
                    sb = self._warm.popleft()
                    if sb.dead:  # died while warm: replace, try the next
                        self._discard(sb)
                        continue
                    self._leased.add(sb)
                    break
        except TimeoutError as e:
            if isinstance(e, SandboxError):
                raise
            self.wait_timeouts += 1
            raise PoolWaitTimeout(
                f"sandbox pool: no sandbox free within {wait_s:g}s ({len(self._leased)} of "
                f"size={self.size} leased, {self.waiting} waiting); raise acquire_timeout_s "
                "to wait longer, or the pool size (SweEnv: sandbox_pool_size) to run more "
                "at once"
            ) from None
        finally:
            if queued:
                self.waiting -= 1
        waited = time.perf_counter() - t0
        self._acquire_s.append(waited)
        if queued:
            self._wait_s.append(waited)
        return sb

    def _ready(self) -> bool:
        """An acquire can go on now (a lease to hand out, or an error to raise)."""
        return self._closed or self._fatal() or (bool(self._warm) and len(self._leased) < self.size)

    def _enqueue(self) -> None:
        if self.waiting >= self.max_waiting:
            self.refused += 1
            raise PoolCapacityError(
                f"sandbox pool full: {len(self._leased)} of size={self.size} leased and "
                f"{self.waiting} requests already waiting (max_waiting={self.max_waiting}); "
                "raise max_waiting to queue more, or the pool size (SweEnv: "
                "sandbox_pool_size) to run more at once"
            )
        self.waiting += 1
        self.queued += 1

    async def release(self, sb: DockerSandbox) -> None:
        """Returns a leased sandbox; it is replaced (or reset) in the background."""
        if sb not in self._leased:
            return
        self._leased.discard(sb)
        if self._closed:
            await sb.close()
            return
        if self.reuse == "reset" and not sb.dead:
            self._creating += 1  # in preparation: counts toward the size
            self._starting.add(sb)  # close() closes it even if the task never runs
            self._spawn(self._recycle(sb))
        else:
            self._retire(sb)
            self._fill()
        async with self._cond:
            self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def sandbox(self, timeout_s: float | None = None) -> AsyncIterator[DockerSandbox]:
        """``async with pool.sandbox() as sb:`` acquires and always releases."""
        sb = await self.acquire(timeout_s)
        try:
            yield sb
        finally:
            await self.release(sb)

    async def check_health(self) -> int:
        """Checks every warm container now; replaces those that fail. Returns how many."""
        bad = 0
        for sb in list(self._warm):
            if not await sb.healthy() and sb in self._warm:
                self._warm.remove(sb)
                self._discard(sb)
                bad += 1
        return bad

    # ------------------------------------------------------------------ metrics
    def _record_exec(self, result: ExecResult) -> None:
        self._exec_s.append(result.duration_s)

    def metrics(self) -> dict[str, float]:
        """Acquire/exec latency percentiles (ms), cold start, failures, containers alive, and
        the queue: waiting now, queued (acquires that waited), refused (``max_waiting``
        reached), wait timeouts and the longest wait (ms) of a queued acquire."""
        return {
            "acquire_p50_ms": _pct(self._acquire_s, 0.5),
            "acquire_p95_ms": _pct(self._acquire_s, 0.95),
            "exec_p50_ms": _pct(self._exec_s, 0.5),
            "exec_p95_ms": _pct(self._exec_s, 0.95),
            "cold_start_p50_ms": _pct(self._start_s, 0.5),
            "failures": float(self.failures),
            "replaced": float(self.replaced),
            "alive": float(len(self._warm) + len(self._leased)),
            "warm": float(len(self._warm)),
            "leased": float(len(self._leased)),
            "waiting": float(self.waiting),
            "queued": float(self.queued),
            "refused": float(self.refused),
            "wait_timeouts": float(self.wait_timeouts),
            "max_wait_ms": max(self._wait_s, default=0.0) * 1e3,
        }

    # ---------------------------------------------------------------- internals
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fatal(self) -> bool:
        return self._fail_streak >= _FATAL_AFTER and not self._warm and not self._creating

    def _raise_if_fatal(self) -> None:
        if self._fatal():
            raise SandboxError(
                f"sandbox pool: {self._fail_streak} container starts failed in a row; "
                f"last error: {self._last_error}"
            )

    def _retire(self, sb: DockerSandbox) -> None:
        self._retiring.add(sb)

        async def _close() -> None:
            await sb.close()
            self._retiring.discard(sb)

        self._spawn(_close())

    def _discard(self, sb: DockerSandbox) -> None:
        self.failures += 1
        self.replaced += 1
        self._retire(sb)
        self._fill()

    def _fill(self) -> None:
        if self._closed or self._fatal():
            return
        deficit = self.size - (len(self._warm) + len(self._leased) + self._creating)
        for _ in range(max(0, deficit)):
            self._creating += 1
            self._spawn(self._create())

    async def _create(self) -> None:
        sb: DockerSandbox | None = None
        try:
            async with self._starts:
                if self._fail_streak:  # back off while the engine keeps failing
                    await asyncio.sleep(min(5.0, 0.2 * 2**self._fail_streak))
                sb = self._factory()
                self._starting.add(sb)
                await sb.start()
                self._starting.discard(sb)
            self._start_s.append(sb.started_s)
            self._fail_streak = 0
        except asyncio.CancelledError:
            raise  # close() closes whatever is in self._starting
        except Exception as e:
            self.failures += 1
            self._fail_streak += 1
            self._last_error = e
            if sb is not None:
                self._starting.discard(sb)
                await sb.close()
            sb = None
        finally:
            self._creating -= 1
        if sb is not None and (self._closed or self._over_size()):
            await sb.close()
            sb = None
        if sb is not None:
            self._warm.append(sb)
        elif not self._closed and not self._fatal():
            self._fill()
        async with self._cond:
            self._cond.notify_all()

    def _over_size(self) -> bool:
        return len(self._warm) + len(self._leased) + self._creating >= self.size

    async def _recycle(self, sb: DockerSandbox) -> None:
        try:
            await sb.reset()
        except SandboxError:
            self._creating -= 1
            self._starting.discard(sb)
            self._discard(sb)
        else:
            self._creating -= 1
            self._starting.discard(sb)
            if self._closed or self._over_size():
                self._retire(sb)
            else:
                self._warm.append(sb)
        async with self._cond:
            self._cond.notify_all()

    async def _monitor(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.health_interval_s)
            if await self.check_health():
                async with self._cond:
                    self._cond.notify_all()
