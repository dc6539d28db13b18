"""The results folder's report.html: the answer first, then the curve, then the details.

First screen: one card per suite with the verdict (turn speculative decoding on or not), and
per load point the TPOT speedup with its CI, the cost per output token of both arms and the
saving with its CI, the acceptance; then the quality check (or "not run"). Below: the
throughput–latency curve per suite with its crossover, then the details (E2E and ITL of each
request over the run, the headline table, and every run's own report embedded).

Self-contained: inline CSS and SVG only, no script, no network (opens offline).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path

from specserve.experiment.headline import COLUMNS, headline_rows, load_label
from specserve.experiment.outcome import ExperimentOutcome
from specserve.experiment.verdict import SuiteVerdict, quality_text, suite_verdicts, sweep_points
from specserve.report.sweep import curve_charts, over_run_charts
from specserve.report.tables import ARM_NOTE, saving, usd

CSS = """body{font-family:sans-serif;margin:16px 24px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:18px 0 6px}
.sub{margin:0 0 10px;color:#555;font-size:13px}
.verdicts{display:flex;flex-wrap:wrap;gap:14px}
.card{border:1px solid #bbb;border-radius:6px;padding:10px 14px;flex:1 1 520px;max-width:760px}
.card h2{margin:0 0 4px}.decision{font-size:20px;font-weight:bold;margin:2px 0;
padding:3px 10px;border-radius:4px;display:inline-block;color:#fff}
.on{background:#1a7f37}.off{background:#b42318}.depends{background:#b54708}
.unclear{background:#667085}.reason{margin:4px 0;font-size:13px}
.card table{font-size:12px;margin:6px 0}.card td{white-space:nowrap}
.quality{font-size:13px;margin:4px 0}
.notrun{color:#b54708;font-weight:bold}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:8px}
iframe{width:100%;height:1400px;border:1px solid #ccc}"""

CARD_HEADER = (
    "load",
    "TPOT speedup [CI]",
    "$/1M output tok, base → spec",
    "cost saving [CI]",
    "accept α / τ",
    "exact match",
)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _card(v: SuiteVerdict, priced: bool) -> str:
    rows = []
    for lv in v.loads:
        t, c = lv.tpot, lv.cost
        speed = "–"
        if t is not None and t.speedup is not None:
            speed = f"{t.speedup:.2f}× [{_f(t.ci_low)}, {_f(t.ci_high)}]"
        cost = "–"
        if c is not None and priced:
            cost = f"{usd(c.baseline_usd_per_mtok)} → {usd(c.candidate_usd_per_mtok)}"
        rows.append(
            [
                f"{'conc ' if lv.load.startswith('c') else ''}{load_label(lv.load)}"
                + ("" if lv.load.startswith("c") else " req/s"),
                speed,
                cost,
                saving(c.saving, c.ci_low, c.ci_high) if c else "–",
                f"{_f(lv.acceptance_rate)} / {_f(lv.acceptance_length)}",
                _f(lv.exact_match),
            ]
        )
    quality = (
        "<span class='notrun'>not run</span> (no task-accuracy check in this experiment)"
        if v.quality is None
        else escape(quality_text(v.quality))
    )
    return (
        f"<div class='card' id='verdict-{escape(Path(v.suite).stem)}'>"
        f"<h2>Suite {escape(v.suite)}</h2>"
        f"<p class='decision {v.decision}'>{escape(v.headline)}</p>"
        f"<p class='reason'>{escape(v.reason)}. As load rises: {escape(v.crossover.text())}.</p>"
        + _table(CARD_HEADER, rows)
        + f"<p class='quality'><b>Quality:</b> {quality}</p></div>"
    )


def _price_line(outcome: ExperimentOutcome) -> str:
    p = outcome.pricing
    if p is None:
        return "No price per instance-hour given: $/1M not computed (the saving does not need one)."
    return f"Price per instance-hour: {p.describe()}. {ARM_NOTE}"


def index_html(outcome: ExperimentOutcome) -> str:
    """The whole page; see the module docstring."""
    verdicts = suite_verdicts(outcome)
    cards = "".join(_card(v, outcome.pricing is not None) for v in verdicts)
    curves = "".join(
        chart for s in outcome.suites() for chart in curve_charts(s, sweep_points(outcome, s))
    )
    over_run = "".join(
        f"<div class='plots'>{''.join(over_run_charts(s, p))}</div>"
        for s in outcome.suites()
        for p in sweep_points(outcome, s)
    )
    runs = []
    for load, suite in outcome.comparisons:
        rel = f"runs/{load}/{Path(suite).stem}/report.html"
        runs.append(
            f"<h3>Suite {escape(suite)}, load {escape(load)}</h3>"
            f"<p><a href='{escape(rel)}'>{escape(rel)}</a></p>"
            f"<iframe src='{escape(rel)}' title='{escape(suite)} {escape(load)}'></iframe>"
        )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>specserve experiment: turn speculative decoding on?</title><style>{CSS}</style>"
        "</head><body>"
        "<h1>Turn speculative decoding on? Baseline vs speculative, per suite</h1>"
        "<p class='sub'>TPOT speedup = baseline median / speculative median; cost saving = "
        "1 − speculative $/1M ÷ baseline $/1M; both with bootstrap 95 % CIs over requests. "
        f"{escape(_price_line(outcome))}</p>"
        f"<section id='verdict' class='verdicts'>{cards}</section>"
        "<h2 id='curve'>Throughput–latency curve</h2><p class='sub'>TPOT p50 (solid) and p90 "
        "(dashed) against output tokens/s, one point per load level; the dashed vertical line "
        "marks where the speculative arm stops being faster.</p>"
        f"<div class='plots'>{curves}</div><h2 id='details'>Details</h2>"
        "<h3>Latency of each request over the run (E2E, per-token ITL)</h3>"
        + over_run
        + "<h3>Headline table</h3>"
        + _table(COLUMNS, headline_rows(outcome))
        + "".join(runs)
        + "</body></html>"
    )
