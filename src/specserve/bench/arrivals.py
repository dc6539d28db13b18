"""Arrival schedules of open-loop load: constant spacing or a seeded Poisson process."""

from __future__ import annotations

import random
from collections.abc import Iterator

from specserve.bench.inputs import OpenLoop


def arrival_offsets_s(
    load: OpenLoop, count: int | None = None, duration_s: float | None = None
) -> Iterator[float]:
    """Send times in seconds after the start, for ``count`` requests or until ``duration_s``.

    Constant: 0, 1/r, 2/r, ...  Poisson: cumulative sums of Exp(r) gaps starting at 0, from
    ``random.Random(load.seed)`` so a seed always gives the same schedule.
    """
    if count is None and duration_s is None:
        raise ValueError("give count or duration_s")
    rng = random.Random(load.seed)
    t, i = 0.0, 0
    while (count is None or i < count) and (duration_s is None or t < duration_s):
        yield t
        i += 1
        # constant: i / rate, not a running sum (0.1 added ten times is < 1.0)
        t = i / load.rate_rps if load.arrival == "constant" else t + rng.expovariate(load.rate_rps)
