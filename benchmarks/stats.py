"""Small statistics the scale and soak benchmarks share: percentiles, a growth slope, RSS.

>>> percentile([1, 2, 3, 4], 50)
2.5
>>> slope([0, 1, 2, 3], [10, 12, 14, 16])
2.0
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

__all__ = ["after_warmup", "cpu_seconds", "percentile", "rss_bytes", "slope"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated between the two
    nearest ranks (numpy's default method); NaN for no values.

    Raises:
        ValueError: ``q`` is outside [0, 100].
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs`` (e.g. bytes of RSS per episode).

    Raises:
        ValueError: Fewer than two points, lengths differ, or every x is the same.
    """
    if len(xs) != len(ys):
        raise ValueError(f"slope needs as many xs as ys, got {len(xs)} and {len(ys)}")
    if len(xs) < 2:
        raise ValueError(f"slope needs at least two points, got {len(xs)}")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("slope needs at least two distinct xs")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def after_warmup(
    samples: Sequence[tuple[float, float]], warmup: float
) -> list[tuple[float, float]]:
    """The ``(x, y)`` samples whose x is at least ``warmup`` (e.g. episodes done)."""
    return [(x, y) for x, y in samples if x >= warmup]


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of process ``pid`` (default: this one), from ``/proc``.

    Raises:
        OSError: The process is gone, or there is no ``/proc`` (Linux only).
    """
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no VmRSS in /proc/{pid or os.getpid()}/status")


def cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) process ``pid`` (default: this one) has used.

    Raises:
        OSError: The process is gone, or there is no ``/proc`` (Linux only).
    """
    with open(f"/proc/{pid or os.getpid()}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
