"""A blocking call awaited from the event loop on a daemon thread of its own.

Not the loop's default pool: each caller (an agent's sync ``solve``, mini-swe-agent's run)
waits on its model and tools for minutes, would exhaust a small pool, and a hung call must
not hold up the process's exit.

Example:
    >>> import asyncio
    >>> asyncio.run(in_daemon_thread(lambda: 6 * 7, name="answer"))
    42
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["in_daemon_thread"]

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[[], T], *, name: str) -> T:
    """``fn()`` on a new daemon thread named ``name``, in a copy of the caller's context.

    Whatever ``fn`` raises (``BaseException`` included) is raised here; if the loop is gone
    when ``fn`` returns, the result is dropped (nobody waits for it)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    def run() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = ctx.run(fn)
        except BaseException as e:  # delivered to the awaiting task, whatever it is
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await fut
