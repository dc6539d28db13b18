"""``specserve experiment [CONFIG.yaml]``: the reference A/B study, end to end."""

from __future__ import annotations

import argparse
import sys

from specserve.commands.signals import start_long_run
from specserve.commands.study import add_study_parser, load_study_config
from specserve.experiment.config import ExperimentConfigError, load_config
from specserve.server.launcher import ServerDiedError, ServerStartError


def register(subparsers: argparse._SubParsersAction) -> None:
    add_study_parser(
        subparsers,
        "experiment",
        help="run the baseline-vs-speculative A/B study (default: the embedded models)",
        description=(
            "Start two servers (baseline and speculative, identical otherwise) or use two "
            "running endpoints, benchmark them alternately on structured and open-ended "
            "prompts at temperature 0, check both arms' task accuracy (a HumanEval subset "
            "run in a sandbox, generated exact-answer questions), and write results, a "
            "comparison table and an HTML report. With no CONFIG the embedded default study "
            "runs."
        ),
        config_help="experiment YAML (see docs/experiment.md)",
        run=run,
    )


def run(args: argparse.Namespace) -> int:
    status = start_long_run()
    cfg = load_study_config(args, load_config, ExperimentConfigError)
    if cfg is None:
        return 2

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
