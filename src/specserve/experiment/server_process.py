"""Run ``specserve serve`` as a child process: free port, readiness wait, clean shutdown.

The experiment owns its servers' whole life: each child runs in its own process group, its
output goes to a log file in the results folder, and :meth:`ServerProcess.stop` (also called
from ``__exit__``, on Ctrl-C and on failure) sends SIGTERM, waits for the drain, then SIGKILLs
the group, so no server outlives the experiment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

logger = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """A server process could not be started or never became ready (message says why)."""


class ServerDiedError(RuntimeError):
    """A server process exited while the experiment still needed it."""


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class ServerProcess:
    """One ``specserve serve`` child process.

    Args:
        name: label used in messages and the log file name (``baseline``, ``speculative``).
        serve_args: arguments after ``specserve serve`` (model, speculation, dtype, ...).
        log_dir: folder for ``<name>.log``.
        host: loopback address to bind.
        port: a fixed port (refused if in use) or None for a free one.
    """

    def __init__(
        self,
        name: str,
        serve_args: list[str],
        log_dir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        self.name = name
        self.host = host
        if port is not None and port_in_use(host, port):
            raise ServerStartError(f"{name}: port {port} on {host} is already in use")
        self.port = port if port is not None else free_port(host)
        self.serve_args = serve_args
        self.log_path = log_dir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "specserve.cli",
            "serve",
            *self.serve_args,
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]

    def start(self) -> None:
        assert self._proc is None, "already started"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        logger.info("starting %s server: %s", self.name, " ".join(self.command))
        self._proc = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: stop() can signal every child
        )
        log.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``/v1/models`` until it answers 200; fail fast if the process exits."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/v1/models").status_code == 200:
                        return
                time.sleep(0.5)
        raise ServerStartError(
            f"{self.name} server not ready after {timeout_s:.0f} s; see {self.log_path}"
        )

    def check_alive(self) -> None:
        """Raise :class:`ServerDiedError` (with the log's tail) if the process has exited."""
        if self._proc is None:
            raise ServerDiedError(f"{self.name} server was never started")
        rc = self._proc.poll()
        if rc is not None:
            raise ServerDiedError(
                f"{self.name} server exited with code {rc}; last log lines:\n{self.log_tail()}"
            )

    def log_tail(self, num_lines: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group, wait up to ``grace_s`` for the drain, then SIGKILL."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s server ignored SIGTERM for %.0f s; killing", self.name, grace_s)
        # The group may hold children (compile workers, ...) even after the leader exited.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
