"""Throughput–latency curves: the crossover, the curve and the per-request charts."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from specserve.bench.records import ChunkRecord
from specserve.bench.results import BenchResult
from specserve.report.svg import scatter_chart, xy_chart
from specserve.report.sweep import SweepPoint, crossover, curve_chart, over_run_charts
from tests.bench_results import closed_loop_result, streamed_record

MS = 1_000_000
NS = "{http://www.w3.org/2000/svg}"


def arm(label: str, tpot_ms: float, concurrency: int, n: int = 6) -> BenchResult:
    """``n`` requests of 10 tokens, TPOT ``tpot_ms``, ``concurrency`` at a time."""
    records = []
    for i in range(n):
        send = (i // concurrency) * int(10 * tpot_ms * MS)
        chunks = [
            ChunkRecord(
                t_ns=send + (k + 1) * int(tpot_ms * MS),
                num_chars=1,
                usage_completion_tokens=k + 1,
                has_choice=True,
            )
            for k in range(10)
        ]
        records.append(streamed_record(i, label, send, chunks))
    return closed_loop_result(label, records, n, concurrency)


def sweep(base_spec_ms: list[tuple[float, float]]) -> list[SweepPoint]:
    concs = [1, 2, 4, 8][: len(base_spec_ms)]
    return [
        SweepPoint(f"c{c}", arm("baseline", b, c), arm("speculative", s, c))
        for c, (b, s) in zip(concs, base_spec_ms, strict=True)
    ]


def test_crossover_where_the_speculative_arm_stops_being_faster() -> None:
    points = sweep([(200, 100), (210, 150), (240, 250), (280, 300)])
    cross = crossover(points)
    assert cross.status == "crosses"
    assert (cross.last_faster, cross.first_not_faster) == ("c2", "c4")
    # interpolated between the two load points' mean throughputs, by the speedup
    assert cross.tps is not None and points[1].mean_tps < cross.tps < points[2].mean_tps
    assert "faster up to c2, not from c4" in cross.text()
    assert crossover(sweep([(200, 100), (210, 150)])).status == "always"
    assert crossover(sweep([(100, 200), (100, 150)])).status == "never"
    assert crossover(sweep([(100, 200), (200, 100)])).status == "mixed"
    assert crossover([]).status == "none"


def test_curve_marks_the_crossover_and_plots_both_arms() -> None:
    points = sweep([(200, 100), (210, 150), (240, 250), (280, 300)])
    svg = curve_chart("TPOT vs throughput", points)
    root = ET.fromstring(svg)
    texts = [t.text or "" for t in root.iter(f"{NS}text")]
    assert any(t.startswith("crossover ≈") for t in texts)
    assert {"baseline p50", "baseline p90", "speculative p50", "speculative p90"} <= set(texts)
    assert {"c1", "c2", "c4", "c8"} <= set(texts)  # load labels on the points
    assert len(root.findall(f"{NS}path")) == 4  # one line per arm and percentile
    assert len([e for e in root.iter(f"{NS}line") if e.get("stroke") == "#000"]) == 1


def test_requests_over_the_run() -> None:
    point = sweep([(200, 100)])[0]
    e2e, itl = over_run_charts("structured", point)
    for svg in (e2e, itl):
        circles = ET.fromstring(svg).findall(f"{NS}circle")
        assert len(circles) == 12  # one dot per request of each arm
    assert "E2E latency of each request — structured, c1" in e2e


def test_xy_and_scatter_charts_are_well_formed() -> None:
    for svg in (
        xy_chart("t", "x", "y", {"a": [(1, 2), (2, 3)]}, dashed=["a"], vline=(1.5, "here")),
        xy_chart("t", "x", "y", {}),
        scatter_chart("t", "x", "y", {"a": [(0.5, 1.0)], "b": []}),
    ):
        assert ET.fromstring(svg).tag.endswith("svg")
