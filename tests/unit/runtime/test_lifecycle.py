"""AsyncClosing: `async with` returns the object and closes it, also on error."""

from __future__ import annotations

import pytest

from agentrl.runtime.lifecycle import AsyncClosing


class Resource(AsyncClosing):
    def __init__(self) -> None:
        self.closes = 0

    async def close(self) -> None:
        self.closes += 1


async def test_async_with_returns_the_object_and_closes_it():
    r = Resource()
    async with r as got:
        assert got is r and r.closes == 0
    assert r.closes == 1


async def test_closes_when_the_body_raises():
    r = Resource()
    with pytest.raises(KeyError):
        async with r:
            raise KeyError("boom")
    assert r.closes == 1
