"""The tune report: acceptance and speedup vs k per proposer and category, the i.i.d.
expectation overlaid, the recommendation table. One self-contained HTML file (inline SVG)."""

from __future__ import annotations

from collections import defaultdict
from html import escape
from pathlib import Path

from specserve.report.svg import step_chart
from specserve.tune.recommend import Recommendation, SweepPoint

CSS = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    ".plots{display:flex;flex-wrap:wrap;gap:12px}"
)


def _series(points: list[SweepPoint], value: str) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for p in sorted(points, key=lambda p: p.k):
        v = getattr(p, value)
        if v is not None:
            series[p.proposer].append((float(p.k), float(v)))
    return dict(series)


def charts_for(category: str, concurrency: int, points: list[SweepPoint]) -> list[str]:
    where = f"{category}, concurrency {concurrency}"
    lengths = _series(points, "mean_acceptance_length")
    for name, pts in _series(points, "iid_expected_length").items():
        lengths[f"{name} i.i.d."] = pts
    return [
        step_chart(f"TPOT speedup vs k ({where})", "k", "× baseline",
                   _series(points, "tpot_speedup"), step=False, markers=True),
        step_chart(f"Acceptance rate vs k ({where})", "k", "α",
                   _series(points, "acceptance_rate"), step=False, markers=True),
        step_chart(f"Mean acceptance length vs k ({where})", "k", "τ (tokens/step)",
                   lengths, step=False, markers=True),
    ]  # fmt: skip


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def render_tune_html(points: list[SweepPoint], recs: list[Recommendation]) -> str:
    rec_rows = [
        [r.proposer, str(r.concurrency), r.category, str(r.recommended_k),
         _f(r.recommended_speedup), str(r.best_k), _f(r.best_speedup)]
        for r in recs
    ]  # fmt: skip
    point_rows = [
        [p.proposer, str(p.concurrency), p.category, str(p.k), _f(p.tpot_speedup),
         f"[{_f(p.ci_low)}, {_f(p.ci_high)}]", _f(p.acceptance_rate),
         _f(p.mean_acceptance_length), _f(p.iid_expected_length), str(p.num_requests)]
        for p in points
    ]  # fmt: skip
    groups: dict[tuple[str, int], list[SweepPoint]] = defaultdict(list)
    for p in points:
        groups[(p.category, p.concurrency)].append(p)
    plots = "".join(
        f"<h3>{escape(cat)}, concurrency {conc}</h3><div class='plots'>"
        + "".join(charts_for(cat, conc, pts))
        + "</div>"
        for (cat, conc), pts in sorted(groups.items())
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>specserve tune</title><style>{CSS}</style></head><body>"
        "<h1>specserve tune: proposer × k × concurrency</h1>"
        "<p>Speedup = median TPOT of the plain baseline / median TPOT at that k, measured "
        "side by side (arms alternated). Acceptance from the speculative server's /metrics "
        "deltas over each arm's batches (per suite run). Recommended k: the smallest k "
        "within tolerance of the best. The 'i.i.d.' lines: the expected τ if every "
        "draft token were accepted independently with the measured α, (1 − α^(k+1))/(1 − α)."
        "</p><h2>Recommendation</h2>"
        + _table(["proposer", "conc", "category", "recommended k", "speedup", "best k",
                  "best speedup"], rec_rows)
        + "<h2>Plots</h2>" + plots + "<h2>All points</h2>"
        + _table(["proposer", "conc", "category", "k", "TPOT speedup", "95% CI", "α", "τ",
                  "i.i.d. τ", "n"], point_rows)
        + "</body></html>"
    )  # fmt: skip


def write_tune_report(points: list[SweepPoint], recs: list[Recommendation], out: Path) -> Path:
    path = out / "tune.html"
    path.write_text(render_tune_html(points, recs), encoding="utf-8")
    return path
