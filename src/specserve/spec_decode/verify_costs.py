"""The k controller's cost model (``k_controller.py``): measured target step times kept per
step size T, the tokens the forward ran (batch size x tokens per request where every request
is padded to the longest), the quantity a forward's time depends on, and a draft's time per
token per batch size (:class:`MeasuredCosts`).
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
    """Seconds per total step size from ``{(batch size, step size): seconds}``: sizes reached
    several ways (batch sizes) are averaged, and the result is made non-decreasing in the
    size. A bigger step never costs less: noisy measurements (a 3-token forward timed below a
    1-token one) would make drafting look cheaper than plain decoding."""
    grouped: dict[int, list[float]] = {}
    for (_, size), seconds in measured.items():
        grouped.setdefault(size, []).append(seconds)
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


class MeasuredCosts:
    """Running averages of measured step times, and estimates for unmeasured steps.

    Args:
        ema: weight of a new measurement in the running averages.
        draft_cost_prior: draft time per token relative to a 1-token verify, until measured.
    """

    def __init__(self, ema: float = 0.2, draft_cost_prior: float = 0.1) -> None:
        self.ema = ema
        self.draft_cost_prior = draft_cost_prior
        self.draft_per_token: dict[int, float] = {}  # batch size -> seconds per draft forward
        self.verify_by_shape: dict[tuple[int, int], float] = {}  # (batch size, step size) -> s
        self._by_size: dict[int, float] | None = None  # step size -> s
        self._seeded: set[tuple[int, int]] = set()  # shapes timed before serving, not yet live

    def seed(self, num_tokens: int, seconds: float) -> None:
        """A forward over ``num_tokens`` of one request timed before serving
        (``warm_start.py``): its estimate until the first live step of that shape, which
        replaces it (a server timed at start may share the machine with another's start)."""
        self.verify_by_shape[(1, num_tokens)] = seconds
        self._seeded.add((1, num_tokens))
        self._by_size = None

    def record(
        self,
        draft_s: float,
        num_draft_steps: int,
        verify_s: float,
        num_tokens: int,
        batch: int,
        step_tokens: int | None = None,
    ) -> None:
        """One step: ``draft_s`` for ``num_draft_steps`` draft forwards (none: 0), a target
        forward of ``num_tokens`` per request for ``batch`` requests in ``verify_s``; its size
        ``step_tokens`` (None: ``batch * num_tokens``, the longest request's padding)."""
        if num_draft_steps > 0:
            self._update(self.draft_per_token, batch, draft_s / num_draft_steps)
        shape = (batch, batch * num_tokens if step_tokens is None else step_tokens)
        if shape in self._seeded:  # the first live timing of a seeded shape replaces the seed
            self._seeded.discard(shape)
            del self.verify_by_shape[shape]
        self._update(self.verify_by_shape, shape, verify_s)
        self._by_size = None

    def _update(self, table: dict, key: object, value: float) -> None:  # type: ignore[type-arg]
        old = table.get(key)
        table[key] = value if old is None else (1 - self.ema) * old + self.ema * value

    def measured_by_size(self) -> dict[int, float]:
        """Measured verify seconds per total step size (``by_size``), rebuilt after each new
        measurement."""
        if self._by_size is None:
            self._by_size = by_size(self.verify_by_shape)
        return self._by_size

    def verify(self, num_tokens: int, batch_size: int = 1) -> float:
        """Estimated target step time for ``num_tokens`` per request in a batch of
        ``batch_size`` (``estimate``; unit 1 per token-free step while nothing is measured)."""
        return estimate(self.measured_by_size(), batch_size * num_tokens)

    def draft(self, k: int, batch_size: int = 1) -> float:
        """Estimated propose time for k draft tokens (the nearest measured batch size's per
        token time, else the prior's fraction of a plain step)."""
        per_token = self.draft_per_token.get(batch_size)
        if per_token is None and self.draft_per_token:
            table = self.draft_per_token
            per_token = table[min(table, key=lambda b: abs(b - batch_size))]
        if per_token is None:
            per_token = self.draft_cost_prior * self.verify(1, batch_size)
        return k * per_token
