"""The experiment's headline table (Markdown): one row per load point and category.

Columns: the load (a concurrency N, or rR for Poisson arrivals at R requests/s), median TPOT of
both arms and its speedup with the bootstrap 95 % CI, median E2E and its speedup, the TTFT
change (speculative/baseline median; ≈1.0 expected, as in the study), acceptance rate and mean
acceptance length of the speculative arm (from /metrics deltas of that suite's run), the exact-
match rate of outputs between arms, the sample counts, and on each suite's all-category row the
cost: each arm's output tokens/s and $/1M output tokens, and the saving with its CI. When the
quality check ran, one line per task follows: each arm's pass@1 with its 95 % CI and the paired
difference with its CI.
"""

from __future__ import annotations

from specserve.bench.compare import CategoryComparison, MetricComparison
from specserve.bench.results import ALL
from specserve.experiment.outcome import ExperimentOutcome
from specserve.experiment.verdict import quality_text, suite_verdicts
from specserve.report.tables import saving, usd

COLUMNS = (
    "load",
    "category",
    "TPOT base ms",
    "TPOT spec ms",
    "TPOT speedup [95% CI]",
    "E2E base s",
    "E2E spec s",
    "E2E speedup",
    "TTFT spec/base",
    "accept rate",
    "accept len",
    "exact match",
    "n (base/spec)",
    "tok/s base/spec",
    "$/1M tok base/spec",
    "cost saving [95% CI]",
)


def load_label(load: str) -> str:
    """``c4`` -> ``4`` (the concurrency), ``r0.5`` stays (a rate in requests/s)."""
    return load[1:] if load.startswith("c") else load


def _metric(row: CategoryComparison, name: str) -> MetricComparison | None:
    return next((m for m in row.metrics if m.metric == name), None)


def _fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if x is None else f"{x * scale:.{digits}f}"


def _speedup(m: MetricComparison | None) -> str:
    if m is None or m.speedup is None:
        return "–"
    ci = "" if m.ci_low is None and m.ci_high is None else f" [{_fmt(m.ci_low)}, {_fmt(m.ci_high)}]"
    return f"{m.speedup:.2f}×{ci}"


def headline_rows(outcome: ExperimentOutcome) -> list[list[str]]:
    rows = []
    pricing = outcome.pricing
    for (load, suite), cmp in outcome.comparisons.items():
        acc = cmp.acceptance.get(load, {}).get("speculative")
        cost = next((c for c in cmp.cost if c.load == load), None)
        for row in cmp.rows:
            tpot, e2e, ttft = _metric(row, "tpot_s"), _metric(row, "e2e_s"), _metric(row, "ttft_s")
            ttft_change = (
                ttft.candidate_p50 / ttft.baseline_p50
                if ttft and ttft.candidate_p50 and ttft.baseline_p50
                else None
            )
            cost_cells = ["", "", ""]
            if cost is not None and row.category == ALL:
                cost_cells = [
                    f"{cost.baseline_tps:.2f}/{cost.candidate_tps:.2f}",
                    f"{usd(cost.baseline_usd_per_mtok)}/{usd(cost.candidate_usd_per_mtok)}"
                    if pricing
                    else "–",
                    saving(cost.saving, cost.ci_low, cost.ci_high),
                ]
            rows.append(
                [
                    load_label(load),
                    f"{suite} (all)" if row.category == ALL else row.category,
                    _fmt(tpot.baseline_p50 if tpot else None, 1e3, 1),
                    _fmt(tpot.candidate_p50 if tpot else None, 1e3, 1),
                    _speedup(tpot),
                    _fmt(e2e.baseline_p50 if e2e else None),
                    _fmt(e2e.candidate_p50 if e2e else None),
                    _speedup(e2e),
                    _fmt(ttft_change),
                    _fmt(acc.acceptance_rate if acc else None),
                    _fmt(acc.mean_acceptance_length if acc else None),
                    _fmt(row.exact_match_rate),
                    f"{row.num_requests_baseline}/{row.num_requests_candidate}",
                    *cost_cells,
                ]
            )
    return rows


def summary_lines(outcome: ExperimentOutcome) -> list[str]:
    """Each suite's verdict and quality check, and the price the costs assume."""
    lines = []
    for v in suite_verdicts(outcome):
        lines.append(
            f"Verdict ({v.suite}): {v.headline}: {v.reason}; as load rises: {v.crossover.text()}; "
            f"quality: {quality_text(v.quality)}"
        )
    p = outcome.pricing
    lines.append(f"Price per instance-hour: {p.describe()}." if p else "No price: no $/1M.")
    return lines


def headline_markdown(outcome: ExperimentOutcome) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in headline_rows(outcome)]
    lines += ["", *summary_lines(outcome)]
    notes = [n for cmp in outcome.comparisons.values() for n in cmp.regressions]
    if notes:
        lines += ["", "Regressions flagged:", *[f"- {n}" for n in notes]]
    if outcome.quality_report is not None:
        lines += ["", outcome.quality_report.markdown().rstrip("\n")]
    return "\n".join(lines) + "\n"


def headline_text(outcome: ExperimentOutcome) -> str:
    """Fixed-width table for the terminal."""
    table = [list(COLUMNS), *headline_rows(outcome)]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table)
    text += "\n\n" + "\n".join(summary_lines(outcome))
    if outcome.quality_report is not None:
        text += "\n\n" + "\n".join(["quality (pass@1 [95 % CI]):", *outcome.quality_report.lines()])
    return text
