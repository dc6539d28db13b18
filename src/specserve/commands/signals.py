"""Treat SIGTERM like Ctrl-C in commands that own child servers (experiment, tune), so a
terminated run (a Kubernetes Job, a CI timeout, ``kill``) still stops its servers and keeps
what it collected instead of dying with the servers left running."""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt in the main thread (call once, from a command)."""
    signal.signal(signal.SIGTERM, _raise_interrupt)


def start_long_run() -> Callable[[str], None]:
    """Set up a command that drives child servers for minutes (experiment, tune): logging on
    stderr without httpx's per-request lines, SIGTERM as Ctrl-C; returns the status printer
    (``[elapsed s] message`` on stderr)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
    interrupt_on_sigterm()
    t0 = time.monotonic()

    def status(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.0f} s] {msg}", file=sys.stderr, flush=True)

    return status
