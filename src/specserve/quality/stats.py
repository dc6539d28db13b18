"""Confidence intervals for pass rates: one arm (Wilson) and the paired difference (Newcombe).

Both arms answer the same problems, so the difference of their pass rates is a paired
difference: with ``both``, ``only_a``, ``only_b`` and ``neither`` counting the problems each
arm passed, only the discordant problems move it. The interval is Newcombe's (1998) method
10, the "square-and-add" of the two Wilson intervals with the correlation of the paired
outcomes (with its continuity correction, as published). It stays inside [-1, 1], has a
nonzero width when no problem is discordant (a handful of agreeing problems cannot prove
equality), and needs no random resampling, so the same answers always give the same
interval. A bootstrap over 8-12 problems would give [0, 0] whenever the arms agree on all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def wilson_interval(passed: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of ``passed / n`` (``(0, 1)`` when n is 0)."""
    if not 0 <= passed <= n:
        raise ValueError(f"passed must be in [0, n], got {passed} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = passed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class PairedCounts:
    """Problems by outcome in arm a and arm b (the same problems in both)."""

    both: int
    only_a: int
    only_b: int
    neither: int

    @property
    def n(self) -> int:
        return self.both + self.only_a + self.only_b + self.neither

    @classmethod
    def of(cls, a: list[bool], b: list[bool]) -> PairedCounts:
        if len(a) != len(b):
            raise ValueError(f"paired outcomes differ in length: {len(a)} vs {len(b)}")
        pairs = list(zip(a, b, strict=True))
        return cls(
            both=sum(x and y for x, y in pairs),
            only_a=sum(x and not y for x, y in pairs),
            only_b=sum(y and not x for x, y in pairs),
            neither=sum(not x and not y for x, y in pairs),
        )


def paired_difference_interval(counts: PairedCounts, z: float = Z95) -> tuple[float, float, float]:
    """(pass rate of b − pass rate of a, low, high): Newcombe's paired method 10."""
    n = counts.n
    if n == 0:
        return 0.0, -1.0, 1.0
    pa = (counts.both + counts.only_a) / n
    pb = (counts.both + counts.only_b) / n
    la, ua = wilson_interval(counts.both + counts.only_a, n, z)
    lb, ub = wilson_interval(counts.both + counts.only_b, n, z)
    margins = (
        (counts.both + counts.only_a)
        * (counts.only_b + counts.neither)
        * (counts.both + counts.only_b)
        * (counts.only_a + counts.neither)
    )
    phi = 0.0
    if margins > 0:
        cross = counts.both * counts.neither - counts.only_a * counts.only_b
        if cross > n / 2:
            phi = (cross - n / 2) / math.sqrt(margins)
        elif cross < 0:
            phi = cross / math.sqrt(margins)
    # The difference b − a: its lower limit combines a's upper and b's lower distances.
    delta = pb - pa
    low = delta - math.sqrt(
        max(0.0, (pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2)
    )
    high = delta + math.sqrt(
        max(0.0, (ub - pb) ** 2 - 2 * phi * (ub - pb) * (pa - la) + (pa - la) ** 2)
    )
    return delta, max(-1.0, low), min(1.0, high)
