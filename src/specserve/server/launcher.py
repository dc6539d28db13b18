"""Start a ``specserve serve`` process on a free loopback port and wait until it is ready.

Used by the end-to-end tests and by ``benchmarks/serve_ab.py``; loopback only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port that was free on the loopback interface a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A ``specserve serve`` child process (a context manager).

    Attributes:
        base_url: ``http://127.0.0.1:<port>`` once started.
        log_path: where the child's stderr/stdout go.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: Path,
        ready_timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://{LOOPBACK}:{self.port}"
        self.args = [
            sys.executable, "-m", "specserve.cli", "serve", *args,
            "--host", LOOPBACK, "--port", str(self.port),
        ]  # fmt: skip
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Poll ``/v1/models`` until 200; raise with the log tail if the process dies."""
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/v1/models", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"server not ready after {self.ready_timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, num_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait; the exit code (kills after ``timeout_s``)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.terminate(timeout_s=30.0)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
