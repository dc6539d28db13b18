"""Treat SIGTERM like Ctrl-C in commands that own child servers (experiment, tune), so a
terminated run (a Kubernetes Job, a CI timeout, ``kill``) still stops its servers and keeps
what it collected instead of dying with the servers left running."""

from __future__ import annotations

import signal
from types import FrameType


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt in the main thread (call once, from a command)."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
