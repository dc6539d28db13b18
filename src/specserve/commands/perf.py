"""``specserve perf``: CPU decode speed of specserve beside transformers, llama.cpp and vLLM.

The command itself lives in :mod:`specserve.perf` (flags: ``perf/options.py``, run:
``perf/main.py``); this module only registers it.
"""

from __future__ import annotations

import argparse

from specserve.perf.options import add_arguments


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "perf", help="CPU performance: specserve vs transformers, llama.cpp and vLLM"
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specserve.perf.main import run as run_perf  # torch and the models: only when run

    return run_perf(args)
