"""Throughput–latency sweeps of an A/B: the curve, its crossover, and latency over the run.

curve: per load point (a concurrency or a request rate), each arm's TPOT p50 and p90 against
    its aggregate output tokens/s (one point per load level, in load order).
crossover: where the candidate stops being faster. Walking the load points in order, the first
    pair where the TPOT speedup (baseline p50 / candidate p50) goes from > 1 to ≤ 1; its
    throughput (mean of both arms' tokens/s) is interpolated linearly in the speedup.
over the run (the reference study's figures 3 and 4): E2E latency and the median per-token
    ITL of each request against its send time (seconds since the A/B run started), both arms
    on one axis; arms alternate in time, so drifts of the machine show in both.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specserve.bench.results import ALL, BenchResult
from specserve.report.svg import PALETTE, empty_chart, scatter_chart, xy_chart

BASE_COLOR, CAND_COLOR = PALETTE[0], PALETTE[1]


@dataclass(frozen=True)
class SweepPoint:
    """Both arms at one load point: ``load`` is ``c<N>`` or ``r<R>``."""

    load: str
    baseline: BenchResult
    candidate: BenchResult

    @property
    def kind(self) -> str:
        return "concurrency" if self.load.startswith("c") else "rate"

    @property
    def tpot_speedup(self) -> float | None:
        b = self.baseline.summary[ALL].tpot_s.p50
        c = self.candidate.summary[ALL].tpot_s.p50
        return b / c if b and c else None

    @property
    def mean_tps(self) -> float:
        return (self.baseline.output_throughput_tps + self.candidate.output_throughput_tps) / 2


@dataclass(frozen=True)
class Crossover:
    """Where (if anywhere) the candidate stops being faster, as the load rises.

    status: ``always`` (faster at every load point), ``never``, ``crosses`` (faster, then not:
    ``last_faster`` → ``first_not_faster``, at about ``tps`` tokens/s), ``mixed`` (neither
    pattern), ``none`` (no speedups to compare).
    """

    status: str
    tps: float | None = None
    last_faster: str | None = None
    first_not_faster: str | None = None

    def text(self) -> str:
        if self.status == "always":
            return "faster at every load point measured"
        if self.status == "never":
            return "not faster at any load point measured"
        if self.status == "crosses":
            return (
                f"faster up to {self.last_faster}, not from {self.first_not_faster} "
                f"(crossover ≈ {self.tps:.3g} tok/s)"
            )
        if self.status == "mixed":
            return "faster at some load points, not in load order"
        return "no TPOT to compare"


def crossover(points: Sequence[SweepPoint]) -> Crossover:
    """The crossover of ``points`` (in load order); see the module docstring."""
    pairs = [(p, p.tpot_speedup) for p in points if p.tpot_speedup is not None]
    if not pairs:
        return Crossover("none")
    faster = [s > 1.0 for _, s in pairs]
    if all(faster):
        return Crossover("always")
    if not any(faster):
        return Crossover("never")
    for (p, s), (q, t) in itertools.pairwise(pairs):
        if s > 1.0 >= t:
            f = (s - 1.0) / (s - t) if s != t else 0.0
            tps = p.mean_tps + f * (q.mean_tps - p.mean_tps)
            return Crossover("crosses", tps, p.load, q.load)
    return Crossover("mixed")


def curve_chart(title: str, points: Sequence[SweepPoint]) -> str:
    """TPOT p50 (solid) and p90 (dashed) in ms against output tok/s, both arms, crossover."""
    if not points:
        return empty_chart(title, "no load points")
    base, cand = points[0].baseline.label, points[0].candidate.label
    series: dict[str, list[tuple[float, float]]] = {}
    labels = []
    for p in points:
        for arm, res in ((base, p.baseline), (cand, p.candidate)):
            tpot = res.summary[ALL].tpot_s
            for q, value in (("p50", tpot.p50), ("p90", tpot.p90)):
                if value is not None:
                    series.setdefault(f"{arm} {q}", []).append(
                        (res.output_throughput_tps, value * 1000)
                    )
        tpot_b = p.baseline.summary[ALL].tpot_s.p50
        if tpot_b is not None:
            labels.append((p.baseline.output_throughput_tps, tpot_b * 1000, p.load))
    cross = crossover(points)
    vline = (cross.tps, f"crossover ≈ {cross.tps:.3g} tok/s") if cross.tps is not None else None
    colors = {f"{base} {q}": BASE_COLOR for q in ("p50", "p90")}
    colors |= {f"{cand} {q}": CAND_COLOR for q in ("p50", "p90")}
    return xy_chart(
        title,
        "output tokens/s (one instance)",
        "TPOT (ms)",
        series,
        colors=colors,
        dashed=[f"{base} p90", f"{cand} p90"],
        vline=vline,
        labels=labels,
    )


def curve_charts(suite: str, points: Sequence[SweepPoint]) -> list[str]:
    """One curve per kind of load swept (closed-loop concurrency, open-loop rate)."""
    charts = []
    for kind in ("concurrency", "rate"):
        pts = [p for p in points if p.kind == kind]
        if pts:
            charts.append(curve_chart(f"TPOT vs throughput — {suite} ({kind} sweep)", pts))
    return charts or [empty_chart(f"TPOT vs throughput — {suite}", "no load points")]


def _per_request(res: BenchResult, metric: str) -> list[tuple[float, float]]:
    points = []
    for r in res.measured():
        if not r.ok:
            continue
        if metric == "e2e" and r.e2e_s is not None:
            points.append((r.send_ns / 1e9, r.e2e_s * 1000))
        elif metric == "itl" and r.itl_s:
            points.append((r.send_ns / 1e9, float(np.median(r.itl_s)) * 1000))
    return points


def over_run_charts(suite: str, point: SweepPoint) -> list[str]:
    """E2E and median per-token ITL of each request against its send time, both arms."""
    colors = {point.baseline.label: BASE_COLOR, point.candidate.label: CAND_COLOR}
    charts = []
    for metric, name in (("e2e", "E2E latency"), ("itl", "median per-token ITL")):
        series = {res.label: _per_request(res, metric) for res in (point.baseline, point.candidate)}
        charts.append(
            scatter_chart(
                f"{name} of each request — {suite}, {point.load}",
                "send time (s since the run started)",
                f"{name} (ms)",
                series,
                colors=colors,
            )
        )
    return charts
