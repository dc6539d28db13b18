"""Environment switches that turn an optional fast path off (``SPECSERVE_...=0``)."""

from __future__ import annotations

import os

_OFF = ("0", "false", "no", "off")


def switched_off(name: str) -> bool:
    """Whether the environment variable ``name`` turns its feature off (0 / false / no / off,
    any case); unset or any other value leaves it on. Read on every call."""
    return os.environ.get(name, "1").strip().lower() in _OFF
