"""Markdown summary of benchmark results and their comparison."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specserve.bench.compare import Comparison
from specserve.bench.pricing import Pricing
from specserve.bench.results import BenchResult
from specserve.report import tables
from specserve.report.tables import ARM_NOTE


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, rows)])


def _section(title: str, *body: str) -> list[str]:
    """The lines of a ``## title`` section: heading, blank line, ``body``, blank line."""
    return [f"## {title}", "", *body, ""]


def render_markdown(
    results: Sequence[BenchResult], comparison: Comparison | None, pricing: Pricing | None = None
) -> str:
    """The Markdown report; latencies in ms, definitions in docs/metrics.md."""
    if pricing is None and comparison is not None:
        pricing = comparison.pricing
    out = [
        "# specserve benchmark report",
        "",
        "Latencies in ms (p50 / p90). Definitions: docs/metrics.md. "
        "llmperf-style ITL = E2E / chunks (includes TTFT, one token per chunk), for "
        "comparison with published llmperf numbers only.",
        "",
        *_section("Runs", md_table(tables.RUN_HEADER, tables.run_rows(results))),
        *_section("Per category", md_table(tables.CATEGORY_HEADER, tables.category_rows(results))),
        *_section(
            "Cost per output token",
            _cost_note(pricing),
            "",
            md_table(tables.COST_HEADER, tables.cost_rows(results, comparison, pricing)),
        ),
    ]
    acc_rows = [
        [r.label, r.load_name, ", ".join(tables.num(a) for a in r.acceptance.per_position) or "–"]
        for r in results
        if r.acceptance.available
    ]
    if acc_rows:
        out += _section(
            "Acceptance per position",
            md_table(["arm", "load", "α per position (0..k−1)"], acc_rows),
        )
    if comparison is not None:
        out += _section(
            f"Comparison with baseline `{comparison.baseline}`",
            "speedup = ratio of medians (> 1: candidate better), bootstrap 95 % CI over requests.",
            "",
            md_table(tables.COMPARE_HEADER, tables.compare_rows(comparison)),
        )
        out += _section(
            "Output parity", md_table(tables.PARITY_HEADER, tables.parity_rows(comparison))
        )
        out += ["## Regressions", ""]
        out += [f"- {note}" for note in comparison.regressions] or ["none flagged"]
        out.append("")
    return "\n".join(out)


def _cost_note(pricing: Pricing | None) -> str:
    if pricing is None:
        return "No price given: $/1M not computed (the saving does not depend on the price)."
    return f"Price per instance-hour: {pricing.describe()}. {ARM_NOTE}"


def write_markdown(
    results: Sequence[BenchResult],
    comparison: Comparison | None,
    path: str | Path,
    pricing: Pricing | None = None,
) -> Path:
    p = Path(path)
    p.write_text(render_markdown(results, comparison, pricing))
    return p
