"""SandboxPool: hands out warm sandboxes and recycles them between episodes."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from agentrl.sandbox.base import Sandbox, SandboxError

__all__ = ["SandboxPool"]

log = logging.getLogger(__name__)


class SandboxPool:
    """A fixed number of started sandboxes, lent out one episode at a time.

    ``async with pool.acquire() as sb:`` waits for a warm sandbox. On return it is
    recycled in the background: ``reset()`` (where the sandbox has one) wipes it, and a
    sandbox without ``reset``, one whose reset fails, one no longer ``alive`` (or ``dead``), one
    that raised ``SandboxError`` in the episode, or one used ``max_uses`` times is closed
    and replaced by a fresh one from ``factory``. Nothing of one episode reaches the next.

    Args:
        factory: Makes a new (not yet started) sandbox.
        size: How many sandboxes the pool holds (lent + idle + being recycled).
        max_uses: Replace a sandbox after this many episodes (``None``: never).
        acquire_timeout_s: How long ``acquire`` waits for a free sandbox before raising
            ``TimeoutError`` (``None``: forever).
        prestart: How many sandboxes ``start`` starts (``None``: ``size``); below ``size``,
            an ``acquire`` that finds none idle starts one more instead of waiting.
        warm: How many more ``start`` then starts in the background, ``warm_concurrency``
            at a time, up to ``size`` in all: warm before episodes need them, without
            holding ``start`` up (e.g. while inference servers boot). One that fails to
            start is logged and counted in ``failures``; an episode's acquire still starts
            its own where there is room.
        warm_concurrency: Background starts at once.
    """

    def __init__(
        self,
        factory: Callable[[], Sandbox],
        size: int,
        *,
        max_uses: int | None = None,
        acquire_timeout_s: float | None = 300.0,
        prestart: int | None = None,
        warm: int = 0,
        warm_concurrency: int = 4,
    ) -> None:
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        if prestart is not None and not 0 <= prestart <= size:
            raise ValueError(f"prestart must be in [0, size={size}], got {prestart}")
        if warm < 0 or warm_concurrency < 1:
            raise ValueError(
                f"need warm >= 0 and warm_concurrency >= 1, got {warm} and {warm_concurrency}"
            )
        self._factory = factory
        self.size = size
        self._prestart = size if prestart is None else prestart
        self._warm = min(warm, size - self._prestart)
        self._warm_concurrency = warm_concurrency
        self._growing = 0  # sandboxes an acquire or the warm-up is starting (counted in size)
        self._max_uses = max_uses
        self._acquire_timeout_s = acquire_timeout_s
        self._idle: asyncio.Queue[Sandbox] = asyncio.Queue()
        self._uses: dict[int, int] = {}
        self._owned: dict[int, Sandbox] = {}  # every started sandbox not yet retired
        self._lent: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._latencies_ms: collections.deque[float] = collections.deque(maxlen=1000)
        self._counts = collections.Counter[str]()
        self._in_use = 0
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False

    async def start(self) -> None:
        """Starts ``prestart`` sandboxes concurrently; raises if any cannot start."""
        async with self._start_lock:
            if self._closed:
                raise SandboxError("pool is closed")
            if self._started:
                return
            n = self._prestart
            results = await asyncio.gather(*(self._new() for _ in range(n)), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            for r in results:
                if not isinstance(r, BaseException):
                    self._idle.put_nowait(r)
            if errors:
                await self._close_idle()
                raise SandboxError(f"{len(errors)}/{n} sandboxes failed to start") from errors[0]
            self._started = True
            if self._warm:
                self._spawn(self._warm_up(self._warm))

    async def _warm_up(self, n: int) -> None:
        """Starts up to ``n`` sandboxes in the background, while the pool has room."""
        gate = asyncio.Semaphore(self._warm_concurrency)

        async def one() -> None:
            async with gate:
                if self._closed or len(self._owned) + self._growing >= self.size:
                    return
                self._growing += 1
                try:
                    sb = await self._new()
                except Exception as e:
                    log.warning("could not start a sandbox ahead of use: %s", e)
                    return
                finally:
                    self._growing -= 1
                await self._shelve(sb)

        await asyncio.gather(*(one() for _ in range(n)))

    async def _new(self) -> Sandbox:
        sb = self._factory()
        try:
            await sb.start()
        except BaseException:
            self._counts["failures"] += 1
            with contextlib.suppress(Exception):
                await sb.close()
            raise
        self._counts["created"] += 1
        self._uses[id(sb)] = 0
        self._owned[id(sb)] = sb
        return sb

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Sandbox]:
        """Lends a warm sandbox for the body of the ``async with``."""
        await self.start()
        t0 = time.perf_counter()
        if self._idle.empty() and len(self._owned) + self._growing < self.size:
            self._growing += 1  # room left: one more instead of waiting for a return
            try:
                sb = await self._new()
            finally:
                self._growing -= 1
        else:
            sb = await asyncio.wait_for(self._idle.get(), self._acquire_timeout_s)
        if self._closed:  # woke up to a sandbox that close() raced with
            await self._retire(sb)
            raise SandboxError("pool is closed")
        self._latencies_ms.append((time.perf_counter() - t0) * 1e3)
        self._counts["acquired"] += 1
        self._in_use += 1
        self._lent.add(id(sb))
        broken = False
        try:
            yield sb
        except SandboxError:
            broken = True
            raise
        finally:
            self._in_use -= 1
            self._lent.discard(id(sb))
            self._uses[id(sb)] = self._uses.get(id(sb), 0) + 1
            self._spawn(self._recycle(sb, broken))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recycle(self, sb: Sandbox, broken: bool) -> None:
        keep = False
        try:
            keep = await self._reset(sb, broken)
        finally:  # also when close() cancels us mid-reset: the sandbox is never lost
            if keep and not self._closed:
                self._idle.put_nowait(sb)
            else:
                self._counts["replaced"] += not self._closed
                await self._retire(sb)
        if not keep:
            await self._refill()

    async def _reset(self, sb: Sandbox, broken: bool) -> bool:
        """Wipes a returned sandbox; False where it must be replaced instead."""
        worn = self._max_uses is not None and self._uses.get(id(sb), 0) >= self._max_uses
        reset = getattr(sb, "reset", None)
        dead = not getattr(sb, "alive", True) or getattr(sb, "dead", False)
        if broken or worn or dead or reset is None or self._closed:
            return False
        try:
            await reset()
        except Exception as e:
            log.warning("sandbox reset failed, replacing it: %s", e)
            return False
        return True

    async def _refill(self) -> None:
        delay = 0.1
        while not self._closed:
            try:
                sb = await self._new()
            except Exception as e:
                log.warning("could not start a replacement sandbox (retry in %.1fs): %s", delay, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            await self._shelve(sb)
            return

    async def _shelve(self, sb: Sandbox) -> None:
        """Puts a fresh sandbox with the idle ones, or retires it once the pool is closed."""
        if self._closed:
            await self._retire(sb)
        else:
            self._idle.put_nowait(sb)

    async def _retire(self, sb: Sandbox) -> None:
        if self._owned.pop(id(sb), None) is None:
            return  # already retired
        self._uses.pop(id(sb), None)
        try:
            await sb.close()
        except Exception as e:
            log.warning("sandbox close failed: %s", e)
        self._counts["closed"] += 1

    async def _close_idle(self) -> None:
        while not self._idle.empty():
            await self._retire(self._idle.get_nowait())

    async def close(self) -> None:
        """Closes every idle sandbox and those being recycled; lent ones close on return."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_idle()
        for key, sb in list(self._owned.items()):  # e.g. recycling tasks cancelled before they ran
            if key not in self._lent:
                await self._retire(sb)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def metrics(self) -> dict[str, float]:
        """Counters and acquire latency (ms, over the last 1000 acquires)."""
        lat = sorted(self._latencies_ms)
        out: dict[str, float] = {
            "size": self.size,
            "idle": self._idle.qsize(),
            "in_use": self._in_use,
            "created": self._counts["created"],
            "acquired": self._counts["acquired"],
            "replaced": self._counts["replaced"],
            "failures": self._counts["failures"],
            "closed": self._counts["closed"],
        }
        if lat:
            out["acquire_ms_mean"] = statistics.fmean(lat)
            out["acquire_ms_p50"] = lat[len(lat) // 2]
            out["acquire_ms_p95"] = lat[min(len(lat) - 1, int(len(lat) * 0.95))]
            out["acquire_ms_max"] = lat[-1]
        return out
