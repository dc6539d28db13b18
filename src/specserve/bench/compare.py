"""A/B comparison of benchmark results: per category and load point, baseline vs candidate.

speedup: ratio of medians, oriented so > 1 means the candidate is better — baseline/candidate
    for latencies (TTFT, TPOT, ITL, E2E), candidate/baseline for per-request throughput.
CI: seeded percentile bootstrap (95 %) of that ratio, resampling *requests* within each arm
    (token-level ITL values of one request move together, since they are not independent).
regression: the CI lies entirely below 1 and the speedup is below ``1 − min_effect``
    (default 3 %: smaller slow-downs are noise on shared machines) with at least 5 requests
    per arm, or the candidate's error rate is higher.
Pairs: requests with the same request id and prompt id in both arms; over pairs that
    both succeeded, length parity = Σ n_candidate / Σ n_baseline, length match = share with
    equal n, exact match = share with identical output text.
Cost: per load point, each arm's output tokens/s and $/1M output tokens at the given price,
    and the candidate's saving with its bootstrap CI (:mod:`specserve.bench.cost`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, Field

from specserve.bench.cost import CostComparison, compare_cost
from specserve.bench.pricing import Pricing
from specserve.bench.records import RequestRecord
from specserve.bench.results import ALL, BenchResult
from specserve.bench.scrape import Acceptance

MIN_REQUESTS_FOR_FLAG = 5  # a bootstrap over fewer requests per arm is too coarse to flag

# metric -> (values of one request, higher is better)
METRICS: dict[str, tuple[Callable[[RequestRecord], list[float]], bool]] = {
    "ttft_s": (lambda r: [r.ttft_s] if r.ttft_s is not None else [], False),
    "tpot_s": (lambda r: [r.tpot_s] if r.tpot_s is not None else [], False),
    "itl_s": (lambda r: r.itl_s, False),
    "e2e_s": (lambda r: [r.e2e_s] if r.e2e_s is not None else [], False),
    "throughput_tps": (
        lambda r: [r.num_tokens / r.e2e_s] if r.e2e_s and r.e2e_s > 0 else [],
        True,
    ),
}


class MetricComparison(BaseModel):
    metric: str
    baseline_p50: float | None
    baseline_p90: float | None
    candidate_p50: float | None
    candidate_p90: float | None
    speedup: float | None = Field(description="Ratio of medians, > 1 = candidate better.")
    ci_low: float | None
    ci_high: float | None
    n_baseline: int = Field(description="Sample count (values) of the baseline.")
    n_candidate: int
    regression: bool


class CategoryComparison(BaseModel):
    load: str = Field(description="Load point, e.g. c4 (concurrency 4) or r2 (2 req/s).")
    category: str
    baseline: str
    candidate: str
    num_requests_baseline: int
    num_requests_candidate: int
    error_rate_baseline: float
    error_rate_candidate: float
    metrics: list[MetricComparison]
    num_pairs: int
    length_parity: float | None
    length_match_rate: float | None
    exact_match_rate: float | None
    llmperf_itl_baseline_s: float | None = Field(description="llmperf-style ITL, median.")
    llmperf_itl_candidate_s: float | None
    regression: bool


class Comparison(BaseModel):
    baseline: str
    rows: list[CategoryComparison]
    acceptance: dict[str, dict[str, Acceptance]] = Field(description="load -> label -> stats.")
    throughput: dict[str, dict[str, float]] = Field(description="load -> label -> Σn/window.")
    regressions: list[str] = Field(description="Human-readable regression notes.")
    pricing: Pricing | None = Field(default=None, description="Price per instance-hour used.")
    cost: list[CostComparison] = Field(
        default_factory=list, description="Per load point and candidate: cost per output token."
    )


def _bootstrap_medians(
    groups: Sequence[Sequence[float]], rng: np.random.Generator, num_resamples: int
) -> np.ndarray:
    """Medians of the pooled values of ``num_resamples`` resamples of the groups (requests).

    A resample with replacement is a multinomial count per group; the pooled median is then
    the weighted (lower) median of all values, weights = their group's count — vectorised.
    """
    values = np.concatenate([np.asarray(g, dtype=np.float64) for g in groups])
    owner = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    order = np.argsort(values, kind="stable")
    values, owner = values[order], owner[order]
    n = len(groups)
    out = np.empty(num_resamples)
    block = max(1, 2_000_000 // max(1, len(values)))  # bound memory to ~16 MB per block
    for start in range(0, num_resamples, block):
        m = min(block, num_resamples - start)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=m)  # [m, num_groups]
        cum = np.cumsum(counts[:, owner], axis=1)  # [m, num_values]
        idx = (cum >= cum[:, -1:] / 2).argmax(axis=1)
        out[start : start + m] = values[idx]
    return out


def bootstrap_ratio(
    base: Sequence[Sequence[float]],
    cand: Sequence[Sequence[float]],
    higher_is_better: bool,
    num_resamples: int = 1000,
    seed: int = 0,
) -> tuple[float | None, float | None, float | None]:
    """Speedup (ratio of medians) and its 95 % CI; inputs are per-request value lists."""
    base = [list(v) for v in base if len(v)]
    cand = [list(v) for v in cand if len(v)]
    if not base or not cand:
        return None, None, None
    b_med = float(np.median(np.concatenate(base)))
    c_med = float(np.median(np.concatenate(cand)))
    rng = np.random.default_rng(seed)
    b_boot = _bootstrap_medians(base, rng, num_resamples)
    c_boot = _bootstrap_medians(cand, rng, num_resamples)
    num, den = (c_boot, b_boot) if higher_is_better else (b_boot, c_boot)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.inf)
    point_num, point_den = (c_med, b_med) if higher_is_better else (b_med, c_med)
    point = point_num / point_den if point_den > 0 else float("inf")
    # A resample whose denominator median is 0 (e.g. chunks stamped by one socket read: ITL 0)
    # has an infinite ratio; interpolating between infinities gives NaN, so such a CI takes
    # the nearest order statistics and an infinite bound is reported as unknown (None).
    if np.isfinite(ratios).all():
        low, high = np.percentile(ratios, [2.5, 97.5])
    else:
        low, high = np.percentile(ratios, [2.5, 97.5], method="nearest")
    return point, _finite(low), _finite(high)


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def compare_category(
    load: str,
    category: str,
    base: BenchResult,
    cand: BenchResult,
    seed: int = 0,
    min_effect: float = 0.03,
) -> CategoryComparison:
    def pick(result: BenchResult) -> list[RequestRecord]:
        return [r for r in result.measured() if category == ALL or r.category == category]

    b_all, c_all = pick(base), pick(cand)
    b_ok, c_ok = [r for r in b_all if r.ok], [r for r in c_all if r.ok]
    metrics = []
    for name, (values, higher) in METRICS.items():
        bv, cv = [values(r) for r in b_ok], [values(r) for r in c_ok]
        flat_b, flat_c = [x for v in bv for x in v], [x for v in cv for x in v]
        speedup, low, high = bootstrap_ratio(bv, cv, higher, seed=seed)
        metrics.append(
            MetricComparison(
                metric=name,
                baseline_p50=_p(flat_b, 50),
                baseline_p90=_p(flat_b, 90),
                candidate_p50=_p(flat_c, 50),
                candidate_p90=_p(flat_c, 90),
                speedup=speedup,
                ci_low=low,
                ci_high=high,
                n_baseline=len(flat_b),
                n_candidate=len(flat_c),
                regression=(
                    high is not None
                    and high < 1.0
                    and (speedup or 1.0) < 1.0 - min_effect
                    and min(len(bv), len(cv)) >= MIN_REQUESTS_FOR_FLAG
                ),
            )
        )
    by_id = {r.request_id: r for r in b_ok}
    pairs = [
        (by_id[r.request_id], r)
        for r in c_ok
        if r.request_id in by_id and by_id[r.request_id].prompt_id == r.prompt_id
    ]
    b_err = 1 - len(b_ok) / len(b_all) if b_all else 0.0
    c_err = 1 - len(c_ok) / len(c_all) if c_all else 0.0
    sum_b = sum(b.num_tokens for b, _ in pairs)

    def llmperf_itl(recs: list[RequestRecord]) -> float | None:
        vals = [r.e2e_s / len(r.tokens_per_chunk) for r in recs if r.e2e_s and r.tokens_per_chunk]
        return _p(vals, 50)

    return CategoryComparison(
        load=load,
        category=category,
        baseline=base.label,
        candidate=cand.label,
        num_requests_baseline=len(b_all),
        num_requests_candidate=len(c_all),
        error_rate_baseline=b_err,
        error_rate_candidate=c_err,
        metrics=metrics,
        num_pairs=len(pairs),
        length_parity=sum(c.num_tokens for _, c in pairs) / sum_b if sum_b else None,
        length_match_rate=(
            sum(b.num_tokens == c.num_tokens for b, c in pairs) / len(pairs) if pairs else None
        ),
        exact_match_rate=(
            sum(b.output_sha256 == c.output_sha256 for b, c in pairs) / len(pairs)
            if pairs
            else None
        ),
        llmperf_itl_baseline_s=llmperf_itl(b_ok),
        llmperf_itl_candidate_s=llmperf_itl(c_ok),
        regression=any(m.regression for m in metrics) or c_err > b_err,
    )


def compare(
    results: Sequence[BenchResult],
    baseline: str | None = None,
    seed: int = 0,
    pricing: Pricing | None = None,
) -> Comparison:
    """Compare every other arm with ``baseline`` (default: the first result's label),
    per load point and category (``*`` = all categories), and their cost per output token
    at ``pricing`` (the saving is reported without a price too: it does not depend on it)."""
    if not results:
        raise ValueError("nothing to compare")
    base_label = baseline or results[0].label
    loads: dict[str, dict[str, BenchResult]] = {}
    for r in results:
        arms = loads.setdefault(r.load_name, {})
        if r.label in arms:
            raise ValueError(f"two results labelled {r.label!r} at load {r.load_name}")
        arms[r.label] = r
    if not any(base_label in arms for arms in loads.values()):
        raise ValueError(f"no result labelled {base_label!r}")
    rows, notes, costs = [], [], []
    for load, arms in loads.items():
        if base_label not in arms:
            continue
        base = arms[base_label]
        for label, cand in arms.items():
            if label == base_label:
                continue
            if base.manifest.prompt_set_hash != cand.manifest.prompt_set_hash:
                notes.append(f"{load}: {label} ran a different prompt set than {base_label}")
            costs.append(compare_cost(load, base, cand, pricing, seed))
            cats = [ALL, *sorted({r.category for r in base.measured()} - {ALL})]
            for cat in cats:
                row = compare_category(load, cat, base, cand, seed)
                rows.append(row)
                for m in row.metrics:
                    if m.regression:
                        notes.append(
                            f"{load} {cat}: {label} slower on {m.metric} "
                            f"(speedup {m.speedup:.3f}, CI high {m.ci_high:.3f})"
                        )
                if row.error_rate_candidate > row.error_rate_baseline:
                    notes.append(
                        f"{load} {cat}: {label} error rate "
                        f"{row.error_rate_candidate:.1%} > {row.error_rate_baseline:.1%}"
                    )
    return Comparison(
        baseline=base_label,
        rows=rows,
        acceptance={ld: {lb: r.acceptance for lb, r in arms.items()} for ld, arms in loads.items()},
        throughput={
            ld: {lb: r.output_throughput_tps for lb, r in arms.items()}
            for ld, arms in loads.items()
        },
        regressions=notes,
        pricing=pricing,
        cost=costs,
    )
