"""``specserve experiment [CONFIG.yaml]``: the reference A/B study, end to end."""

from __future__ import annotations

import argparse
import sys

from specserve.commands.signals import start_long_run
from specserve.experiment.config import ExperimentConfigError, load_config
from specserve.server.launcher import ServerDiedError, ServerStartError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "experiment",
        help="run the baseline-vs-speculative A/B study (default: the embedded models)",
        description=(
            "Start two servers (baseline and speculative, identical otherwise) or use two "
            "running endpoints, benchmark them alternately on structured and open-ended "
            "prompts at temperature 0, and write results, a comparison table and an HTML "
            "report. With no CONFIG the embedded default study runs."
        ),
    )
    p.add_argument("config", nargs="?", help="experiment YAML (see docs/experiment.md)")
    p.add_argument("--output-dir", help="results folder (overrides the config)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    status = start_long_run()
    try:
        cfg = load_config(args.config)
    except ExperimentConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output_dir:
        cfg = cfg.model_copy(update={"output_dir": args.output_dir})

    from specserve.experiment.headline import headline_text
    from specserve.experiment.runner import default_output_dir, run_experiment

    out = default_output_dir(cfg.name, cfg.output_dir)
    cfg = cfg.model_copy(update={"output_dir": str(out)})
    try:
        outcome = run_experiment(cfg, on_status=status)
    except KeyboardInterrupt:
        print(f"\ninterrupted; servers stopped; results so far are in {out}", file=sys.stderr)
        return 130
    except (ServerStartError, ServerDiedError) as e:
        print(f"error: {e}\nresults so far are in {out}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {type(e).__name__}: {e}\nresults so far are in {out}", file=sys.stderr)
        return 1
    print(headline_text(outcome))
    print(f"\nresults: {outcome.output_dir}  (headline.md, comparison.json, report.html)")
    status("done")
    return 0
