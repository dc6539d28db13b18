"""``specserve compare A B ...``: compare saved benchmark results and write the report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specserve.bench.compare import compare
from specserve.bench.results import load_result
from specserve.commands.pricing_args import add_pricing_arguments, pricing_from_args
from specserve.report.html import write_report
from specserve.report.markdown import md_table
from specserve.report.tables import COMPARE_HEADER, COST_HEADER, compare_rows, cost_rows


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="compare saved benchmark results (A/B report)", description=__doc__
    )
    p.add_argument("results", nargs="+", help="result.json files or their directories")
    p.add_argument("--baseline", help="label of the baseline arm (default: the first result's)")
    p.add_argument(
        "--relabel",
        action="store_true",
        help="label each result by its file's directory name (when labels collide)",
    )
    p.add_argument("--output", default="compare-report", help="report directory")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    add_pricing_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        pricing = pricing_from_args(args)
        results = [load_result(p) for p in args.results]
        if args.relabel:
            for path, r in zip(args.results, results, strict=True):
                p = Path(path)
                r.label = (p if p.is_dir() else p.parent).name
        comparison = compare(results, baseline=args.baseline, seed=args.seed, pricing=pricing)
    except ValueError as e:
        print(f"specserve compare: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.output)
    paths = write_report(results, comparison, out)
    (out / "comparison.json").write_text(comparison.model_dump_json(indent=1))
    print(md_table(COMPARE_HEADER, compare_rows(comparison)))
    print()
    print(md_table(COST_HEADER, cost_rows(results, comparison, pricing)))
    for note in comparison.regressions:
        print(f"REGRESSION: {note}")
    print(f"report: {paths['html']}")
    return 0
