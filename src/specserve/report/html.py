"""Self-contained HTML report: tables plus inline SVG plots; opens offline, no scripts.

Plots: ECDFs of TTFT / TPOT / per-token ITL / E2E per category with one line per arm and load
point; a tokens-vs-time timeline of a representative request per category (the median-E2E
request of the candidate among requests both arms completed: a staircase when speculation
streams several tokens per chunk, a ramp otherwise); speedup by category with 95 % CIs;
speedup by concurrency (sweeps); acceptance per draft position.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from html import escape
from pathlib import Path

from specserve.bench.compare import Comparison
from specserve.bench.pricing import Pricing
from specserve.bench.records import RequestRecord
from specserve.bench.results import BenchResult
from specserve.report.emf import write_emf
from specserve.report.markdown import write_markdown
from specserve.report.svg import bar_chart, ecdf_chart, empty_chart, step_chart
from specserve.report.tables import (
    ARM_NOTE,
    CATEGORY_HEADER,
    COMPARE_HEADER,
    COST_HEADER,
    PARITY_HEADER,
    RUN_HEADER,
    category_rows,
    compare_rows,
    cost_rows,
    parity_rows,
    run_rows,
)

CSS = """body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;
margin:8px 0 20px;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.plots{display:flex;
flex-wrap:wrap;gap:8px}.flag{color:#b00;font-weight:bold}code{background:#f3f3f3}"""

ECDF_METRICS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "per-token ITL", "e2e_s": "E2E"}


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="flag">{escape(c)}</td>' if c == "REGRESSION" else f"<td>{escape(c)}</td>"
            for c in row
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _values(r: RequestRecord, metric: str) -> list[float]:
    if metric == "itl_s":
        return [x * 1000 for x in r.itl_s]
    v = getattr(r, metric)
    return [] if v is None else [v * 1000]


def _ecdfs(results: Sequence[BenchResult]) -> list[str]:
    cats = sorted({r.category for res in results for r in res.measured()})
    charts = []
    for cat in cats:
        for metric, name in ECDF_METRICS.items():
            samples = {
                f"{res.label}@{res.load_name}": [
                    x
                    for r in res.measured()
                    if r.ok and r.category == cat
                    for x in _values(r, metric)
                ]
                for res in results
            }
            charts.append(ecdf_chart(f"{name} ECDF — {cat}", f"{name} (ms)", samples))
    return charts


def _timelines(results: Sequence[BenchResult], comparison: Comparison | None) -> list[str]:
    load = results[0].load_name
    arms = [r for r in results if r.load_name == load]
    base = next((r for r in arms if comparison and r.label == comparison.baseline), arms[0])
    cand = next((r for r in arms if r is not base), base)
    charts = []
    cats = sorted({r.category for r in base.measured()})
    for cat in cats[:6]:
        base_ok = {r.request_id: r for r in base.measured() if r.ok and r.category == cat}
        pairs = [r for r in cand.measured() if r.ok and r.request_id in base_ok and r.e2e_s]
        if not pairs:
            continue
        pick = sorted(pairs, key=lambda r: r.e2e_s or 0.0)[len(pairs) // 2]
        series = {}
        for res, rec in ((base, base_ok[pick.request_id]), (cand, pick)):
            points, total = [(0.0, 0.0)], 0
            for t, k in zip(rec.token_times_s, rec.tokens_per_chunk, strict=True):
                total += k
                points.append((t * 1000, float(total)))
            series[f"{res.label}"] = points
        charts.append(
            step_chart(
                f"Tokens vs time — {cat}, {pick.prompt_id} ({load})",
                "time since send (ms)",
                "tokens received",
                series,
            )
        )
    return charts or [empty_chart("Tokens vs time", "no successful request")]


def _speedups(comparison: Comparison | None, results: Sequence[BenchResult]) -> list[str]:
    if comparison is None or not comparison.rows:
        return [empty_chart("Speedup", "one arm only: nothing to compare")]
    charts = []
    for load in dict.fromkeys(row.load for row in comparison.rows):
        rows = [row for row in comparison.rows if row.load == load]
        for cand in dict.fromkeys(row.candidate for row in rows):
            crow = [row for row in rows if row.candidate == cand]
            bars = {}
            for metric in ("itl_s", "tpot_s", "e2e_s", "ttft_s"):
                ms = [next(m for m in row.metrics if m.metric == metric) for row in crow]
                bars[metric] = [(m.speedup, m.ci_low, m.ci_high) for m in ms]
            charts.append(
                bar_chart(
                    f"Speedup of {cand} by category ({load})",
                    "× (median ratio)",
                    [row.category for row in crow],
                    bars,
                    reference=1.0,
                )
            )
    loads = {r.load_name: r.concurrency for r in results if r.concurrency is not None}
    if len(loads) > 1:
        series: dict[str, list[tuple[float, float]]] = {}
        for row in comparison.rows:
            m = next(m for m in row.metrics if m.metric == "itl_s")
            if row.load in loads and m.speedup is not None:
                key = f"{row.candidate} {row.category}"
                series.setdefault(key, []).append((float(loads[row.load] or 0), m.speedup))
        charts.append(
            step_chart(
                "ITL speedup by concurrency",
                "concurrency",
                "× (median ratio)",
                series,
                step=False,
                markers=True,
            )
        )
    return charts


def _acceptance(results: Sequence[BenchResult]) -> str:
    avail = [r for r in results if r.acceptance.available and r.acceptance.per_position]
    if not avail:
        return empty_chart("Acceptance per position", "no spec-decode counters scraped")
    k = max(len(r.acceptance.per_position) for r in avail)
    bars = {
        f"{r.label}@{r.load_name}": [
            (r.acceptance.per_position[i], None, None)
            if i < len(r.acceptance.per_position)
            else (None, None, None)
            for i in range(k)
        ]
        for r in avail
    }
    return bar_chart(
        "Acceptance per draft position", "accepted / drafts", [str(i) for i in range(k)], bars
    )


def cost_note(pricing: Pricing | None) -> str:
    """What the $/1M figures assume (shared by the reports)."""
    if pricing is None:
        return (
            "No price given (--price-per-hour or --instance): $/1M not computed. The saving "
            "does not depend on the price (both arms pay the same per instance-hour)."
        )
    return (
        f"Price per instance-hour: {pricing.describe()}. {ARM_NOTE} "
        "$/1M = price per hour / 3600 / (output tok/s) × 1e6; saving = 1 − cost ratio, "
        "bootstrap 95 % CI (docs/metrics.md, Cost)."
    )


def render_html(
    results: Sequence[BenchResult], comparison: Comparison | None, pricing: Pricing | None = None
) -> str:
    """The whole report as one HTML string."""
    if not results:
        raise ValueError("no results to report")
    if pricing is None and comparison is not None:
        pricing = comparison.pricing
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    sections = [
        f"<h1>specserve benchmark report</h1><p>Generated {when}. Latencies in ms. "
        "Definitions in docs/metrics.md. llmperf-style ITL (E2E / chunks, includes TTFT, one "
        "token per chunk) is shown only for comparison with published llmperf results.</p>",
        "<h2>Runs</h2>" + _table(RUN_HEADER, run_rows(results)),
        "<h2>Per category</h2>" + _table(CATEGORY_HEADER, category_rows(results)),
        f"<h2>Cost per output token</h2><p>{escape(cost_note(pricing))}</p>"
        + _table(COST_HEADER, cost_rows(results, comparison, pricing)),
    ]
    if comparison is not None:
        notes = "".join(f"<li>{escape(n)}</li>" for n in comparison.regressions) or "<li>none</li>"
        sections += [
            f"<h2>Comparison with baseline <code>{escape(comparison.baseline)}</code></h2>"
            "<p>speedup = ratio of medians (&gt; 1: candidate better), bootstrap 95 % CI.</p>"
            + _table(COMPARE_HEADER, compare_rows(comparison)),
            "<h2>Output parity</h2>" + _table(PARITY_HEADER, parity_rows(comparison)),
            f"<h2>Regressions</h2><ul>{notes}</ul>",
        ]
    plots = {
        "Speedup": _speedups(comparison, results),
        "Tokens vs time (representative request)": _timelines(results, comparison),
        "Acceptance": [_acceptance(results)],
        "Latency ECDFs": _ecdfs(results),
    }
    for title, charts in plots.items():
        sections.append(f"<h2>{escape(title)}</h2><div class='plots'>{''.join(charts)}</div>")
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>specserve benchmark report</title><style>{CSS}</style></head><body>"
        + "\n".join(sections)
        + "</body></html>"
    )


def write_report(
    results: Sequence[BenchResult],
    comparison: Comparison | None,
    directory: str | Path,
    pricing: Pricing | None = None,
) -> dict[str, Path]:
    """Write report.html, report.md and emf.jsonl into ``directory``; returns their paths.

    ``pricing`` (default: the comparison's) prices the output tokens of every arm.
    """
    if pricing is None and comparison is not None:
        pricing = comparison.pricing
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    html = out / "report.html"
    html.write_text(render_html(results, comparison, pricing), encoding="utf-8")
    now_ms = int(time.time() * 1000)
    return {
        "html": html,
        "markdown": write_markdown(results, comparison, out / "report.md", pricing),
        "emf": write_emf(results, out / "emf.jsonl", now_ms, pricing, comparison),
    }
