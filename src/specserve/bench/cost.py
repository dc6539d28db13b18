"""Cost per output token of each arm and the candidate's saving, with a bootstrap CI.

throughput of one instance: Σ n over the successful measured requests / window (the result's
    ``output_throughput_tps``; one arm = one server = one instance).
$/1M output tokens: hourly price / 3600 / throughput × 1e6 (see :mod:`specserve.bench.pricing`).
saving: 1 − cost_candidate / cost_baseline = 1 − throughput_baseline / throughput_candidate. Both
    arms pay the same hourly price, so the saving does not depend on it (it is reported even
    without a price, and with ``local`` = 0).
CI: seeded percentile bootstrap (95 %) resampling *requests* within each arm, as the speedups
    in :mod:`specserve.bench.compare` do. Each request carries its tokens and a share of its
    batch's window proportional to its duration (send → done), so a resample's throughput is
    Σ tokens / Σ shares and the point estimate is exactly Σ n / window.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, Field

from specserve.bench.pricing import Pricing
from specserve.bench.records import RequestRecord
from specserve.bench.results import BenchResult


class CostComparison(BaseModel):
    """Cost per output token of baseline and candidate at one load point (all categories)."""

    load: str
    baseline: str
    candidate: str
    baseline_tps: float = Field(description="Output tokens/s of one baseline instance.")
    candidate_tps: float
    price_per_hour: float | None = Field(description="USD per instance-hour incl. energy.")
    baseline_usd_per_mtok: float | None = Field(description="$ per 1M output tokens.")
    candidate_usd_per_mtok: float | None
    saving: float | None = Field(description="1 − candidate cost / baseline cost.")
    ci_low: float | None
    ci_high: float | None
    num_requests_baseline: int
    num_requests_candidate: int


def window_shares(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(output tokens, window share in s) of each measured request.

    A batch's window (first send → last finish, as in the result's window) is split over its
    requests in proportion to their durations; failed requests count their time, not tokens.
    """
    batches: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if not r.warmup:
            batches[r.batch].append(r)
    tokens: list[float] = []
    shares: list[float] = []
    for recs in batches.values():
        window = (max(r.done_ns or r.send_ns for r in recs) - min(r.send_ns for r in recs)) / 1e9
        durations = [max(0, (r.done_ns or r.send_ns) - r.send_ns) for r in recs]
        total = sum(durations)
        for r, d in zip(recs, durations, strict=True):
            tokens.append(float(r.num_tokens) if r.ok else 0.0)
            shares.append(window * d / total if total > 0 else window / len(recs))
    return np.asarray(tokens), np.asarray(shares)


def bootstrap_throughput(
    tokens: np.ndarray, shares: np.ndarray, rng: np.random.Generator, num_resamples: int
) -> np.ndarray:
    """Σ tokens / Σ shares of ``num_resamples`` resamples of the requests (NaN if no time)."""
    n = len(tokens)
    out = np.full(num_resamples, np.nan)
    if n == 0:
        return out
    block = max(1, 2_000_000 // n)  # bound the count matrix to ~16 MB per block
    for start in range(0, num_resamples, block):
        m = min(block, num_resamples - start)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=m)  # [m, n]
        num, den = counts @ tokens, counts @ shares
        with np.errstate(divide="ignore", invalid="ignore"):
            out[start : start + m] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return out


def saving_ci(
    base: BenchResult, cand: BenchResult, seed: int = 0, num_resamples: int = 1000
) -> tuple[float | None, float | None, float | None]:
    """The candidate's cost saving 1 − tps_base / tps_cand and its 95 % bootstrap CI."""
    tb, sb = window_shares(base.records)
    tc, sc = window_shares(cand.records)
    if base.output_throughput_tps <= 0 or cand.output_throughput_tps <= 0:
        return None, None, None
    point = 1.0 - base.output_throughput_tps / cand.output_throughput_tps
    rng = np.random.default_rng(seed)
    b_boot = bootstrap_throughput(tb, sb, rng, num_resamples)
    c_boot = bootstrap_throughput(tc, sc, rng, num_resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        savings = 1.0 - b_boot / c_boot
    savings = savings[np.isfinite(savings)]
    if savings.size == 0:
        return point, None, None
    low, high = np.percentile(savings, [2.5, 97.5])
    return point, float(low), float(high)


def compare_cost(
    load: str, base: BenchResult, cand: BenchResult, pricing: Pricing | None, seed: int = 0
) -> CostComparison:
    saving, low, high = saving_ci(base, cand, seed)
    return CostComparison(
        load=load,
        baseline=base.label,
        candidate=cand.label,
        baseline_tps=base.output_throughput_tps,
        candidate_tps=cand.output_throughput_tps,
        price_per_hour=pricing.hourly_usd if pricing else None,
        baseline_usd_per_mtok=pricing.usd_per_million(base.output_throughput_tps)
        if pricing
        else None,
        candidate_usd_per_mtok=pricing.usd_per_million(cand.output_throughput_tps)
        if pricing
        else None,
        saving=saving,
        ci_low=low,
        ci_high=high,
        num_requests_baseline=len(base.measured()),
        num_requests_candidate=len(cand.measured()),
    )
