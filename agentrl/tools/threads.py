"""ToolThreads: the bounded pool of threads that sync tools run in, apart from everything else.

Sync tools used to run in the event loop's default executor, which also runs env.reset/step
and the trainer step: a few tools stuck past their timeout filled it and the whole run
stalled. They now run here, in daemon threads of their own, at most ``max_threads`` at once.

A Python thread cannot be killed. When a call's timeout passes, its caller gets the timeout
at once, but the thread runs on until the function returns (maybe never); it is then
*stuck* and counted (:attr:`ToolThreads.stuck`, reported as the ``tool_threads_stuck``
metric, with a warning the first time). Stuck threads keep their slot, so at most
``max_threads`` can pile up; once all slots are stuck, sync tool calls fail at once with
:class:`ToolThreadsExhausted` (a message the model sees) instead of queueing forever. A
slot comes back when its function finally returns. The threads are daemon threads, so a
stuck one never keeps the process from exiting. (Running the tool in a subprocess instead
would let it be killed, but tools are closures over per-episode objects such as sandboxes
that cannot be sent to another process; a tool that needs a hard kill should run its work
in a sandbox, whose exec is killed at its timeout.)

Example:
    >>> import asyncio
    >>> asyncio.run(ToolThreads(2).run(sum, [1, 2]))
    3
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ToolThreads", "ToolThreadsExhausted", "default_tool_threads"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class ToolThreadsExhausted(RuntimeError):
    """Every tool thread is stuck in a call that outlived its timeout."""


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():  # the caller stopped waiting (timeout, cancellation)
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class ToolThreads:
    """Runs sync functions in at most ``max_threads`` daemon threads; counts stuck ones.

    Args:
        max_threads: Most functions running at once (stuck ones included).
    """

    def __init__(self, max_threads: int = 32) -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self.max_threads = max_threads
        self._lock = threading.Lock()
        self._running = 0  # threads inside a function, abandoned ones included
        self._stuck = 0  # of those, the ones whose caller stopped waiting
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._warned = False

    @property
    def running(self) -> int:
        """Threads inside a function now (stuck ones included)."""
        return self._running

    @property
    def stuck(self) -> int:
        """Threads still running a function whose caller gave up on it (timeout, cancel)."""
        return self._stuck

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            # One per event loop; threads stuck under an earlier loop still hold their slots.
            self._slots = asyncio.Semaphore(max(0, self.max_threads - self._running))
            self._slots_loop = loop
        return self._slots

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Runs ``fn(*args, **kwargs)`` in a tool thread and returns (or raises) its outcome.

        Any exception the function raises (SystemExit and KeyboardInterrupt included) is
        raised here; if the caller is cancelled, the thread runs on and counts as stuck.

        Raises:
            ToolThreadsExhausted: Every thread is stuck; nothing was run.
        """
        if self._stuck >= self.max_threads:
            raise ToolThreadsExhausted(
                f"all {self.max_threads} tool threads are stuck in calls that outlived their "
                "timeout (a thread cannot be killed); sync tools cannot run until one returns"
            )
        slots = self._semaphore()
        await slots.acquire()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        ctx = contextvars.copy_context()
        state = {"abandoned": False, "finished": False}

        def work() -> None:
            result: Any = None
            exc: BaseException | None = None
            try:
                result = ctx.run(fn, *args, **kwargs)
            except BaseException as e:  # the caller decides what to do with it
                exc = e
            finally:
                with self._lock:
                    state["finished"] = True
                    self._running -= 1
                    if state["abandoned"]:
                        self._stuck -= 1
            try:
                loop.call_soon_threadsafe(_settle, fut, result, exc)
                loop.call_soon_threadsafe(slots.release)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        with self._lock:
            self._running += 1
        name = f"agentrl-tool-{getattr(fn, '__name__', 'call')}"
        try:
            threading.Thread(target=work, name=name, daemon=True).start()
        except BaseException:
            with self._lock:
                self._running -= 1
            slots.release()
            raise
        try:
            return await fut
        except asyncio.CancelledError:
            with self._lock:
                if not state["finished"]:
                    state["abandoned"] = True
                    self._stuck += 1
                    stuck = self._stuck
                else:
                    stuck = 0
            if stuck and not self._warned:
                self._warned = True
                log.warning(
                    "a sync tool (%s) outlived its timeout; its thread runs on and cannot be "
                    "killed (%d of %d tool threads stuck; see the tool_threads_stuck metric)",
                    name,
                    stuck,
                    self.max_threads,
                )
            raise


_default: ToolThreads | None = None
_default_lock = threading.Lock()


def default_tool_threads() -> ToolThreads:
    """The process-wide pool that ``@tool`` sync functions run in."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ToolThreads()
        return _default
