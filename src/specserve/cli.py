"""``specserve`` command line: a dispatcher; each subcommand lives in ``specserve.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> module defining ``register(subparsers)``; the module sets ``func`` on its parser.
COMMANDS: dict[str, str] = {
    "serve": "specserve.commands.serve",
    "bench": "specserve.commands.bench",
    "compare": "specserve.commands.compare",
    "tune": "specserve.commands.tune",
    "experiment": "specserve.commands.experiment",
    "deploy": "specserve.commands.deploy",
    "models": "specserve.commands.models",
    "generate": "specserve.commands.generate",
    "perf": "specserve.commands.perf",
    "train-draft": "specserve.commands.train_draft",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specserve",
        description="Speculative-decoding LLM serving: engine, server, benchmark, tuner, deployer.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
