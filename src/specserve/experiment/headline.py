"""The experiment's headline table (Markdown): one row per concurrency level and category.

Columns: median TPOT of both arms and its speedup with the bootstrap 95 % CI, median E2E and
its speedup, the TTFT change (speculative/baseline median; ≈1.0 expected, as in the study),
acceptance rate and mean acceptance length of the speculative arm (from /metrics deltas of
that suite's run), the exact-match rate of outputs between arms and the sample counts. When
the quality check ran, one line per task follows: each arm's pass@1 with its 95 % CI and the
paired difference with its CI.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from specserve.bench.compare import CategoryComparison, MetricComparison
from specserve.bench.results import ALL
from specserve.experiment.outcome import ExperimentOutcome

COLUMNS = (
    "conc",
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
)


def _metric(row: CategoryComparison, name: str) -> MetricComparison | None:
    return next((m for m in row.metrics if m.metric == name), None)


def _fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if x is None else f"{x * scale:.{digits}f}"


def _speedup(m: MetricComparison | None) -> str:
    if m is None or m.speedup is None:
        return "–"
    ci = "" if m.ci_low is None or m.ci_high is None else f" [{m.ci_low:.2f}, {m.ci_high:.2f}]"
    return f"{m.speedup:.2f}×{ci}"


def headline_rows(outcome: ExperimentOutcome) -> list[list[str]]:
    rows = []
    for (conc, suite), cmp in outcome.comparisons.items():
        acc = cmp.acceptance.get(f"c{conc}", {}).get("speculative")
        for row in cmp.rows:
            tpot, e2e, ttft = _metric(row, "tpot_s"), _metric(row, "e2e_s"), _metric(row, "ttft_s")
            ttft_change = (
                ttft.candidate_p50 / ttft.baseline_p50
                if ttft and ttft.candidate_p50 and ttft.baseline_p50
                else None
            )
            rows.append(
                [
                    str(conc),
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
                ]
            )
    return rows


def headline_markdown(outcome: ExperimentOutcome) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in headline_rows(outcome)]
    notes = [n for cmp in outcome.comparisons.values() for n in cmp.regressions]
    if notes:
        lines += ["", "Regressions flagged:", *[f"- {n}" for n in notes]]
    if outcome.quality is not None:
        lines += ["", outcome.quality.markdown().rstrip("\n")]
    return "\n".join(lines) + "\n"


def headline_text(outcome: ExperimentOutcome) -> str:
    """Fixed-width table for the terminal."""
    table = [list(COLUMNS), *headline_rows(outcome)]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table)
    if outcome.quality is not None:
        text += "\n\n" + "\n".join(["quality (pass@1 [95 % CI]):", *outcome.quality.lines()])
    return text


def index_html(outcome: ExperimentOutcome) -> str:
    """The results folder's report.html: the headline table, then each run's own report
    (runs/c<concurrency>/<suite>/report.html, self-contained) embedded below it."""
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
        for row in headline_rows(outcome)
    )
    cells = []
    for conc, suite in outcome.comparisons:
        rel = f"runs/c{conc}/{Path(suite).stem}/report.html"
        cells.append(
            f"<h2>Suite {escape(suite)}, concurrency {conc}</h2>"
            f"<p><a href='{escape(rel)}'>{escape(rel)}</a></p>"
            f"<iframe src='{escape(rel)}' title='{escape(suite)} c{conc}'></iframe>"
        )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<title>specserve experiment</title><style>"
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "iframe{width:100%;height:1400px;border:1px solid #ccc}</style></head><body>"
        "<h1>specserve experiment: baseline vs speculative</h1>"
        "<p>TPOT speedup = median baseline TPOT / median speculative TPOT, bootstrap 95 % CI; "
        "acceptance from the speculative server's /metrics deltas over that suite's run.</p>"
        f"<table><tr>{head}</tr>{body}</table>" + "".join(cells) + "</body></html>"
    )
