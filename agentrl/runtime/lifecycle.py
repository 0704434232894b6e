"""The ``async with`` half of a resource's lifecycle, written once.

A class that owns connections, processes or actors defines an idempotent
``async close()``; inheriting :class:`AsyncClosing` makes ``async with obj:``
return ``obj`` and close it on the way out, whatever happened inside.
"""

from __future__ import annotations

from typing import Self

__all__ = ["AsyncClosing"]


class AsyncClosing:
    """Mixin: ``async with x:`` yields ``x`` and awaits ``x.close()`` on exit."""

    async def close(self) -> None:
        """Releases the resource (idempotent); subclasses define it."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
