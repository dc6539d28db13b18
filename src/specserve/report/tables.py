"""Table rows shared by the Markdown and HTML reports (latencies in ms)."""

from __future__ import annotations

from collections.abc import Sequence

from specserve.bench.compare import Comparison
from specserve.bench.metrics import Distribution
from specserve.bench.pricing import Pricing
from specserve.bench.results import BenchResult


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


def num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def usd(value: float | None) -> str:
    if value is None:
        return "–"
    return f"${value:,.2f}" if value >= 1 or value == 0 else f"${value:.4f}"


def saving(value: float | None, low: float | None = None, high: float | None = None) -> str:
    """A cost saving with its CI, e.g. ``35.0% [28.1%, 41.0%]`` (negative: dearer)."""
    if value is None:
        return "–"
    ci = "" if low is None and high is None else f" [{pct(low)}, {pct(high)}]"
    return f"{value:.1%}{ci}"


def _pair(d: Distribution) -> str:
    return f"{ms(d.p50)} / {ms(d.p90)}"


RUN_HEADER = [
    "arm",
    "load",
    "endpoint",
    "model",
    "requests",
    "errors",
    "output tok/s",
    "achieved load (target)",
    "drift flagged",
    "acceptance α",
    "τ",
]


def run_rows(results: Sequence[BenchResult]) -> list[list[str]]:
    rows = []
    for r in results:
        spec, s, lc, acc = r.manifest.spec, r.summary["*"], r.load_check, r.acceptance
        rows.append(
            [
                r.label,
                r.load_name,
                spec["endpoint"],
                spec["model"],
                str(s.num_requests),
                f"{s.num_errors} ({pct(s.error_rate)})",
                num(r.output_throughput_tps, 1),
                f"{num(lc.achieved)} ({num(lc.target)})",
                "yes" if lc.flagged else "no",
                pct(acc.acceptance_rate) if acc.available else "n/a",
                num(acc.mean_acceptance_length) if acc.available else "n/a",
            ]
        )
    return rows


CATEGORY_HEADER = [
    "arm",
    "load",
    "category",
    "n ok",
    "errors",
    "TTFT p50/p90",
    "TPOT p50/p90",
    "ITL/token p50/p90",
    "E2E p50/p90",
    "tokens/chunk p50",
    "tok/s/request p50",
    "queue p99",
    "llmperf-style ITL p50",
    "n estimated",
]


def category_rows(results: Sequence[BenchResult]) -> list[list[str]]:
    rows = []
    for r in results:
        for cat, s in r.summary.items():
            rows.append(
                [
                    r.label,
                    r.load_name,
                    cat,
                    str(s.num_requests - s.num_errors),
                    str(s.num_errors),
                    _pair(s.ttft_s),
                    _pair(s.tpot_s),
                    _pair(s.itl_s),
                    _pair(s.e2e_s),
                    num(s.tokens_per_chunk.p50),
                    num(s.request_throughput_tps.p50, 1),
                    ms(s.queue_s.p99),
                    ms(s.llmperf_itl_s.p50),
                    str(s.tokens_estimated),
                ]
            )
    return rows


COMPARE_HEADER = [
    "load",
    "category",
    "metric",
    "baseline p50",
    "baseline p90",
    "candidate p50",
    "candidate p90",
    "speedup [95% CI]",
    "samples (b/c)",
    "flag",
]


def _val(metric: str, v: float | None) -> str:
    return num(v, 1) if metric == "throughput_tps" else ms(v)


def compare_rows(comparison: Comparison) -> list[list[str]]:
    rows = []
    for row in comparison.rows:
        for m in row.metrics:
            ci = f"{num(m.speedup, 3)} [{num(m.ci_low, 3)}, {num(m.ci_high, 3)}]"
            rows.append(
                [
                    row.load,
                    row.category,
                    m.metric,
                    _val(m.metric, m.baseline_p50),
                    _val(m.metric, m.baseline_p90),
                    _val(m.metric, m.candidate_p50),
                    _val(m.metric, m.candidate_p90),
                    ci,
                    f"{m.n_baseline}/{m.n_candidate}",
                    "REGRESSION" if m.regression else "",
                ]
            )
    return rows


PARITY_HEADER = [
    "load",
    "category",
    "candidate",
    "pairs",
    "length parity",
    "same length",
    "exact match",
    "errors (b/c)",
    "llmperf-style ITL p50 (b/c)",
]


def parity_rows(comparison: Comparison) -> list[list[str]]:
    return [
        [
            row.load,
            row.category,
            row.candidate,
            str(row.num_pairs),
            num(row.length_parity, 3),
            pct(row.length_match_rate),
            pct(row.exact_match_rate),
            f"{pct(row.error_rate_baseline)}/{pct(row.error_rate_candidate)}",
            f"{ms(row.llmperf_itl_baseline_s)}/{ms(row.llmperf_itl_candidate_s)}",
        ]
        for row in comparison.rows
    ]


ARM_NOTE = "Output tok/s of one instance = the arm's ÷ instances per arm (default 1)."

COST_HEADER = [
    "load",
    "arm",
    "output tok/s (one instance)",
    "$/1M output tokens",
    "cost saving vs baseline [95% CI]",
]


def cost_rows(
    results: Sequence[BenchResult], comparison: Comparison | None, pricing: Pricing | None
) -> list[list[str]]:
    """Per arm and load point: throughput, $/1M output tokens and (candidates) the saving."""
    savings = {(c.load, c.candidate): c for c in comparison.cost} if comparison else {}
    rows = []
    for r in results:
        c = savings.get((r.load_name, r.label))
        rows.append(
            [
                r.load_name,
                r.label,
                num(
                    pricing.per_instance(r.output_throughput_tps)
                    if pricing
                    else r.output_throughput_tps,
                    2,
                ),
                usd(pricing.usd_per_million(r.output_throughput_tps)) if pricing else "–",
                saving(c.saving, c.ci_low, c.ci_high) if c else "–",
            ]
        )
    return rows
