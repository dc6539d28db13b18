"""Run ``specserve serve`` as a child process: free port, readiness wait, clean shutdown.

Used by ``specserve experiment`` / ``tune`` and the end-to-end tests; loopback only. Each
child runs in its own process group with its output in a log file;
:meth:`ServerProcess.stop` (also from ``__exit__``, on Ctrl-C and on failure) sends SIGTERM,
waits for the drain, then SIGKILLs the group, so no server outlives its owner.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

from specserve.net import LOOPBACK, free_port, port_in_use

logger = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """A server process could not be started or never became ready (message says why)."""


class ServerDiedError(RuntimeError):
    """A server process exited while it was still needed (message has its log's tail)."""


class ServerProcess:
    """One ``specserve serve`` child process (a context manager: start + wait, then stop).

    Args:
        args: arguments after ``specserve serve`` (model, speculation, dtype, ...).
        log_path: where the child's stdout/stderr go.
        name: label used in messages (``baseline``, ``speculative``, ...).
        host: loopback address to bind.
        port: a fixed port (refused if in use) or None for a free one.
        ready_timeout_s: how long :meth:`wait_ready` waits for ``/v1/models``.
        env: extra environment variables for the child.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: Path,
        name: str = "server",
        host: str = LOOPBACK,
        port: int | None = None,
        ready_timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
    ) -> None:
        if port is not None and port_in_use(host, port):
            raise ServerStartError(f"{name}: port {port} on {host} is already in use")
        self.name = name
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.base_url = f"http://{host}:{self.port}"
        self.args = [
            sys.executable, "-m", "specserve.cli", "serve", *args,
            "--host", host, "--port", str(self.port),
        ]  # fmt: skip
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def launch(self) -> None:
        """Start the child without waiting for readiness (start several, then wait)."""
        assert self.proc is None, "already started"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("starting %s: %s", self.name, " ".join(self.args))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # own process group: stop() can signal every child
            )

    def start(self) -> ServerProcess:
        """Launch and wait until ready."""
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Poll ``/v1/models`` until it answers 200; fail fast if the process exits."""
        timeout = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/v1/models", timeout=5.0).status_code == 200:
                    return
            time.sleep(0.25)
        raise ServerStartError(
            f"{self.name} not ready after {timeout:.0f} s; see {self.log_path}:\n{self.log_tail()}"
        )

    def check_alive(self) -> None:
        """Raise :class:`ServerDiedError` (with the log's tail) if the process has exited."""
        if self.proc is None:
            raise ServerDiedError(f"{self.name} was never started")
        rc = self.proc.poll()
        if rc is not None:
            raise ServerDiedError(
                f"{self.name} server exited with code {rc}; last log lines:\n{self.log_tail()}"
            )

    def log_tail(self, num_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return "(no log)"

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM the server and wait for its drain; returns its exit code (kills after
        ``timeout_s`` and re-raises the timeout)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_group()
            raise

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM, wait up to ``grace_s`` for the drain, then SIGKILL the whole group."""
        if self.proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.terminate(timeout_s=grace_s)
        self._kill_group()  # the group may hold children even after the leader exited

    def _kill_group(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
