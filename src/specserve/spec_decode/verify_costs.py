"""The k controller's verify-cost model (``k_controller.py``): measured target step times
kept per total step size T = batch size x tokens per request, the quantity a forward's time
depends on.
"""

from __future__ import annotations

# Relative cost of a forward over T tokens vs 1 when nothing is measured yet: +2 % per token
# (memory-bound small steps: measured on a 2-core CPU, 1-5 tokens cost about what 1 does,
# 8-16 about 1.2x).
VERIFY_SLOPE_PRIOR = 0.02


def prior(num_step_tokens: int) -> float:
    """The prior's cost of a T-token forward, relative to a 1-token one."""
    return 1.0 + VERIFY_SLOPE_PRIOR * (num_step_tokens - 1)


def by_size(measured: dict[tuple[int, int], float]) -> dict[int, float]:
    """Seconds per total step size from ``{(batch size, tokens per request): seconds}``:
    sizes reached several ways are averaged, and the result is made non-decreasing in the
    size. A bigger step never costs less: noisy measurements (a 3-token forward timed below a
    1-token one) would make drafting look cheaper than plain decoding."""
    grouped: dict[int, list[float]] = {}
    for (b, n), seconds in measured.items():
        grouped.setdefault(b * n, []).append(seconds)
    out: dict[int, float] = {}
    running = 0.0
    for t in sorted(grouped):
        running = max(running, sum(grouped[t]) / len(grouped[t]))
        out[t] = running
    return out


def estimate(cost: dict[int, float], size: int) -> float:
    """Estimated seconds of a forward over ``size`` tokens from ``by_size``'s table: measured,
    else interpolated linearly between the nearest measured sizes; past the largest, along the
    slope of the two largest (never below the prior's scaling); otherwise scaled from the
    nearest by the prior. With nothing measured, the prior itself (unit 1 per 1-token step)."""
    if not cost:
        return prior(size)
    if size in cost:
        return cost[size]
    below = [t for t in cost if t < size]
    above = [t for t in cost if t > size]
    if below and above:
        lo, hi = max(below), min(above)
        return cost[lo] + (cost[hi] - cost[lo]) * (size - lo) / (hi - lo)
    nearest = max(below) if below else min(above)
    scaled = cost[nearest] * prior(size) / prior(nearest)
    if above or len(below) < 2:
        return scaled
    # Past the largest measured size: along the slope of the two largest ones (a CPU whose
    # multi-row steps are compute bound costs far more than the prior slope says).
    lo = max(t for t in below if t < nearest)
    slope = (cost[nearest] - cost[lo]) / (nearest - lo)
    return max(scaled, cost[nearest] + slope * (size - nearest))
