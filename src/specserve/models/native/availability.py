"""Whether a native kernel runs in this process: decided once, switchable off at any time.

Each kernel module (``int4_native.py``, ``bf16_native.py``) holds one :class:`Availability`:
the first ``available()`` call builds or loads the op library and runs the kernel's
self-test (its ``load`` callable), once per process under a lock; a failure is logged once
with its reason and the callers fall back. The kernel's environment switch
(``SPECSERVE_..._NATIVE=0``) is read on every call and turns it off without building anything.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from specserve.models.native import build
from specserve.models.native.env_switch import switched_off


class Availability:
    """One kernel's availability (see the module docstring).

    Args:
        what: the kernel's name in the log line (``int4``, ``bf16``).
        env_switch: the environment variable that turns it off.
        load: builds / loads and self-tests the kernel; None on success, else why not.
        logger: where the one warning goes.
    """

    def __init__(
        self, what: str, env_switch: str, load: Callable[[], str | None], logger: logging.Logger
    ) -> None:
        self.what = what
        self.env_switch = env_switch
        self._load = load
        self._logger = logger
        self._lock = threading.Lock()
        self.state: dict[str, object] = {}  # "ok": bool, "reason": str | None, once decided

    def disabled(self) -> bool:
        return switched_off(self.env_switch)

    def available(self) -> bool:
        """False when switched off (checked on every call) or after a failed build / an
        unsupported CPU (decided on the first call, the reason logged once)."""
        if self.disabled():
            return False
        if "ok" not in self.state:
            with self._lock:
                if "ok" not in self.state:
                    reason = self._load()
                    if reason is None:
                        build.register_fakes()
                    else:
                        self._logger.warning(
                            "native %s kernel unavailable, falling back: %s", self.what, reason
                        )
                    self.state["reason"] = reason
                    self.state["ok"] = reason is None
        return bool(self.state["ok"])

    def loaded(self) -> bool:
        """Whether an earlier :meth:`available` call loaded the kernel (no switch read)."""
        return self.state.get("ok") is True

    def unavailable_reason(self) -> str | None:
        """Why :meth:`available` is False (None when it is True or was never asked)."""
        if self.disabled():
            return f"disabled by {self.env_switch}={os.environ.get(self.env_switch)}"
        reason = self.state.get("reason")
        return reason if isinstance(reason, str) else None
