"""``specserve tune [CONFIG.yaml]``: sweep proposer × k × concurrency, recommend k."""

from __future__ import annotations

import argparse
import sys

from specserve.commands.signals import start_long_run
from specserve.commands.study import add_study_parser, load_study_config
from specserve.tune.config import TuneConfigError, load_tune_config


def register(subparsers: argparse._SubParsersAction) -> None:
    add_study_parser(
        subparsers,
        "tune",
        help="sweep proposer/draft × k × concurrency and recommend k",
        description=(
            "Start one plain baseline server and, per proposer, one speculative server "
            "(restarted only when the proposer changes; k varies per request), benchmark "
            "every k against the baseline side by side, and write tune.json and tune.html "
            "with acceptance and speedup vs k and the recommended k per category."
        ),
        config_help="tune YAML (default: the embedded sweep)",
        run=run,
    )


def run(args: argparse.Namespace) -> int:
    status = start_long_run()
    cfg = load_study_config(args, load_tune_config, TuneConfigError)
    if cfg is None:
        return 2

    from specserve.server.launcher import ServerDiedError, ServerStartError
    from specserve.tune.sweep import run_tune

    try:
        outcome = run_tune(cfg, on_status=status)
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped; partial results kept", file=sys.stderr)
        return 130
    except (ServerStartError, ServerDiedError, ValueError, RuntimeError, OSError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for r in outcome.recommendations:
        print(
            f"{r.proposer:>16}  c={r.concurrency:<3} {r.category:<12} "
            f"recommended k={r.recommended_k} ({r.recommended_speedup:.2f}×), "
            f"best k={r.best_k} ({r.best_speedup:.2f}×)"
        )
    print(f"\nresults: {outcome.output_dir}  (tune.json, tune.html)")
    return 0
