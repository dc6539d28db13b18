"""HTML / Markdown / EMF reports from real (mock-server) results."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specserve.bench.compare import Comparison, compare
from specserve.bench.pricing import resolve_pricing
from specserve.bench.results import BenchResult
from specserve.report.emf import emf_lines
from specserve.report.html import render_html, write_report
from specserve.report.markdown import render_markdown
from specserve.report.svg import bar_chart, ecdf_chart, nice_ticks, step_chart

Results = tuple[list[BenchResult], Comparison]


def test_nice_ticks() -> None:
    assert nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.013, 0.048)[0] <= 0.013 and nice_ticks(0.013, 0.048)[-1] >= 0.048
    assert nice_ticks(5, 5) == pytest.approx([5, 6, 7, 8, 9, 10])


def test_charts_are_well_formed_svg() -> None:
    for svg in (
        ecdf_chart("t", "ms", {"a": [3.0, 1.0, 2.0], "empty": []}),
        step_chart("t", "x", "y", {"a": [(0, 0), (1, 2)], "b": [(0.5, 1)]}),
        bar_chart("t", "y", ["g1", "g2"], {"a": [(1.0, 0.9, 1.1), (None, None, None)]}, 1.0),
        ecdf_chart("t", "ms", {}),
    ):
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")
    ecdf = ET.fromstring(ecdf_chart("t", "ms", {"a": [3.0, 1.0, 2.0]}))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(ecdf.findall(f"{ns}path")) == 1
    assert any("a (n=3)" in (t.text or "") for t in ecdf.iter(f"{ns}text"))


def test_html_is_self_contained_with_all_plots(ab_results: Results) -> None:
    results, comparison = ab_results
    html = render_html(results, comparison)
    assert "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    for title in (
        "TTFT ECDF — repeat",
        "TPOT ECDF — prose",
        "per-token ITL ECDF — repeat",
        "E2E ECDF — prose",
        "Tokens vs time — repeat",
        "Speedup of candidate by category",
        "ITL speedup by concurrency",
        "Acceptance per draft position",
    ):
        assert title in html, title
    svgs = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    assert len(svgs) >= 8 + 2 + 2 + 1 + 1
    for svg in svgs:
        ET.fromstring(svg)


def test_markdown_tables(ab_results: Results) -> None:
    results, comparison = ab_results
    md = render_markdown(results, comparison)
    assert "## Comparison with baseline `baseline`" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| c1 | * | itl_s")]
    assert len(rows) == 1
    speedup = float(rows[0].split("|")[8].split()[0])
    assert speedup > 1.5  # 3 ms vs 1 ms per token, modulo noise
    assert "## Acceptance per position" in md and "| candidate | c1 | 1.00, 1.00, 0.00 |" in md


def test_emf_lines(ab_results: Results) -> None:
    results, _ = ab_results
    lines = [json.loads(x) for x in emf_lines(results, timestamp_ms=123)]
    assert len(lines) == sum(len(r.summary) for r in results)
    first = lines[0]
    directive = first["_aws"]["CloudWatchMetrics"][0]
    assert first["_aws"]["Timestamp"] == 123
    assert directive["Dimensions"] == [["Variant", "TestCase", "Concurrency"]]
    for metric in directive["Metrics"]:
        assert isinstance(first[metric["Name"]], float | int)
    assert {(x["Variant"], x["TestCase"], x["Concurrency"]) for x in lines} >= {
        ("baseline", "all", "1"),
        ("candidate", "prose", "2"),
    }
    cand = next(x for x in lines if x["Variant"] == "candidate" and x["TestCase"] == "all")
    assert cand["MeanAcceptanceLength"] == pytest.approx(3.0)


def test_write_report_files(ab_results: Results, tmp_path: Path) -> None:
    results, comparison = ab_results
    paths = write_report(results, comparison, tmp_path / "out")
    assert {p.name for p in paths.values()} == {"report.html", "report.md", "emf.jsonl"}
    assert all(p.stat().st_size > 100 for p in paths.values())
    with pytest.raises(ValueError, match="no results"):
        render_html([], None)


def test_cost_per_output_token_in_every_report(ab_results: Results) -> None:
    results, _ = ab_results
    pricing = resolve_pricing("g6e.xlarge")
    assert pricing is not None
    comparison = compare(results, baseline="baseline", pricing=pricing)
    html = render_html(results, comparison)  # the comparison's price is the default
    assert "<h2>Cost per output token</h2>" in html and "g6e.xlarge: $1.861/h" in html
    md = render_markdown(results, comparison)
    row = next(ln for ln in md.splitlines() if ln.startswith("| c1 | candidate |"))
    tps, usd, saving = (c.strip() for c in row.strip("|").split("|")[2:5])
    assert float(usd.lstrip("$").replace(",", "")) == pytest.approx(
        1.861 / 3600 / float(tps) * 1e6, rel=0.01
    )
    assert saving.endswith("]") and float(saving.split("%")[0]) > 0  # 3× faster: cheaper
    unpriced = render_markdown(results, compare(results, baseline="baseline"))
    assert "No price given" in unpriced and "| c1 | baseline |" in unpriced


def test_emf_lines_carry_cost(ab_results: Results) -> None:
    results, _ = ab_results
    pricing = resolve_pricing("trn1.32xlarge")
    comparison = compare(results, baseline="baseline", pricing=pricing)
    lines = [json.loads(x) for x in emf_lines(results, 1, pricing, comparison)]
    alls = {(x["Variant"], x["Concurrency"]): x for x in lines if x["TestCase"] == "all"}
    base, cand = alls[("baseline", "1")], alls[("candidate", "1")]
    assert base["PricePerHour"] == 21.5
    assert base["CostPerMillionOutputTokens"] == pytest.approx(
        21.5 / 3600 / base["OutputThroughput"] * 1e6
    )
    assert "CostSaving" not in base and cand["CostSavingCILow"] <= cand["CostSaving"]
    names = {m["Name"] for m in cand["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"CostPerMillionOutputTokens", "CostSaving", "CostSavingCIHigh"} <= names
    assert all("Cost" not in k for x in emf_lines(results, 1) for k in json.loads(x))
