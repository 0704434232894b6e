"""Where a run's wall time goes: seconds per phase (model, servers, evaluation, training).

Example:
    >>> clock = PhaseClock()
    >>> with clock.phase("model"):
    ...     pass
    >>> sorted(clock.summary())
    ['model', 'total']
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["PhaseClock", "describe_phases"]


class PhaseClock:
    """Adds up wall seconds per named phase from its creation on (``total``)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Counts the time inside the ``with`` block (however it ends) towards ``name``."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - t0)

    def add(self, name: str, seconds: float) -> None:
        """Counts ``seconds`` towards ``name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, seconds)

    def summary(self) -> dict[str, float]:
        """Seconds per phase and ``total`` since the clock started, rounded to 0.1 s."""
        out = {k: round(v, 1) for k, v in self.seconds.items()}
        out["total"] = round(time.monotonic() - self.start, 1)
        return out


def describe_phases(seconds: dict[str, float]) -> str:
    """One line, e.g. ``time: model 21 s | servers 48 s | total 5 min 3 s``."""

    def fmt(s: float) -> str:
        return f"{s:.0f} s" if s < 60 else f"{int(s // 60)} min {s % 60:.0f} s"

    return "time: " + " | ".join(f"{k} {fmt(v)}" for k, v in seconds.items())
