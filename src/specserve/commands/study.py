"""What the study commands (``experiment``, ``tune``) share: a parser with an optional
CONFIG and ``--output-dir``, and loading that config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

ConfigT = TypeVar("ConfigT", bound=BaseModel)


def add_study_parser(
    subparsers: argparse._SubParsersAction,
    name: str,
    *,
    help: str,
    description: str,
    config_help: str,
    run: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """Add the sub-command ``name`` taking ``[CONFIG] [--output-dir DIR]`` and running ``run``."""
    p = subparsers.add_parser(name, help=help, description=description)
    p.add_argument("config", nargs="?", help=config_help)
    p.add_argument("--output-dir", help="results folder (overrides the config)")
    p.set_defaults(func=run)
    return p


def load_study_config(
    args: argparse.Namespace,
    load: Callable[[str | None], ConfigT],
    error: type[Exception],
) -> ConfigT | None:
    """The config named by ``args.config`` (the embedded default when absent), with
    ``--output-dir`` applied; None after printing the message of a refused config."""
    try:
        cfg = load(args.config)
    except error as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    if args.output_dir:
        cfg = cfg.model_copy(update={"output_dir": args.output_dir})
    return cfg
