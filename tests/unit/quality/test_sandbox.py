"""The code sandbox: a correct program passes; a program that hangs, forks, writes outside its
directory, allocates without bound or opens a socket is killed or refused, counted as failed,
and touches nothing else."""

from __future__ import annotations

import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from specserve.quality import sandbox
from specserve.quality.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    isolation_description,
    namespace_prefix,
    run_python,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux-only")

FAST = SandboxLimits(timeout_s=5.0, memory_mb=256)
HAS_NAMESPACES = sys.platform == "linux" and bool(namespace_prefix("auto"))


def test_a_correct_program_passes() -> None:
    r = run_python("def f(x):\n    return 2 * x\n\nassert f(21) == 42\n", FAST)
    assert r.passed and r.status == "passed" and r.returncode == 0


def test_a_failing_assertion_fails_with_its_exception() -> None:
    r = run_python("assert 1 == 2, 'wrong'\n", FAST)
    assert not r.passed and r.status == "failed"
    assert "AssertionError: wrong" in r.detail


@pytest.mark.parametrize("code", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"])
def test_exiting_early_is_not_passing(code: str) -> None:
    assert not run_python(code, FAST).passed


def test_code_that_hangs_is_killed_at_the_timeout() -> None:
    limits = SandboxLimits(timeout_s=1.5, memory_mb=256)
    t0 = time.monotonic()
    r = run_python("import time\ntime.sleep(3600)\n", limits)
    assert r.status == "timed out" and not r.passed
    assert time.monotonic() - t0 < 10


def test_a_busy_loop_is_stopped_by_the_cpu_limit() -> None:
    r = run_python("while True:\n    pass\n", SandboxLimits(timeout_s=20.0, cpu_s=1))
    assert not r.passed and r.status == "killed" and "SIGXCPU" in r.detail
    assert r.seconds < 15


def test_a_fork_bomb_is_refused() -> None:
    r = run_python("import os\nwhile True:\n    os.fork()\n", FAST)
    assert not r.passed and "os.fork refused" in r.detail


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['true'])\n",
        "import os\nos.system('true')\n",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()\n",
        "import ctypes\n",
    ],
    ids=["subprocess", "system", "multiprocessing", "ctypes"],
)
def test_starting_processes_or_native_code_is_refused(code: str) -> None:
    r = run_python(code, FAST)
    assert not r.passed and "refused" in r.detail


@pytest.mark.parametrize("isolation", ["auto", "off"])
def test_nothing_the_program_starts_outlives_it(tmp_path: Path, isolation: str) -> None:
    """Guard off (so fork works, as root): a grandchild that would write a file 1.5 s later
    dies with the run (PID namespace, or the process-group kill)."""
    marker = tmp_path / "grandchild-was-here"
    code = (
        "import os, time\n"
        "try:\n    pid = os.fork()\nexcept OSError:\n    pid = -1\n"  # RLIMIT_NPROC, not root
        f"if pid == 0:\n    time.sleep(1.5)\n    open({str(marker)!r}, 'w').close()\n"
        "    os._exit(0)\n"
    )
    r = run_python(code, SandboxLimits(timeout_s=5.0, guard=False, isolation=isolation))  # type: ignore[arg-type]
    assert r.passed
    time.sleep(2.5)
    assert not marker.exists()


def test_writing_outside_the_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')\n", FAST)
    assert not r.passed and "outside the sandbox directory" in r.detail
    assert not target.exists()


def test_removing_or_renaming_outside_the_directory_is_refused(tmp_path: Path) -> None:
    keep = tmp_path / "keep.txt"
    keep.write_text("data")
    for code in (
        f"import os\nos.remove({str(keep)!r})\n",
        f"import os\nos.rename({str(keep)!r}, 'stolen.txt')\n",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})\n",
        f"import os\nos.symlink('x', {str(tmp_path / 'link')!r})\n",
    ):
        r = run_python(code, FAST)
        assert not r.passed and "refused" in r.detail, code
    assert keep.read_text() == "data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_writing_inside_the_directory_works_and_is_cleaned_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = (
        "import os, tempfile\n"
        "open('scratch.txt', 'w').write('x')\n"
        "with tempfile.NamedTemporaryFile('w', delete=False) as f:\n    f.write('y')\n"
        "os.mkdir('sub')\nos.rename('scratch.txt', 'sub/moved.txt')\n"
        "assert open('sub/moved.txt').read() == 'x'\n"
    )
    assert run_python(code, FAST).passed
    assert list(tmp_path.iterdir()) == []  # the whole sandbox directory is gone


def test_unbounded_allocation_is_stopped_by_the_memory_limit() -> None:
    limits = SandboxLimits(timeout_s=10.0, memory_mb=128)
    r = run_python("x = []\nwhile True:\n    x.append(bytearray(10**7))\n", limits)
    assert not r.passed and "MemoryError" in r.detail
    r = run_python("x = bytearray(2**32)\n", limits)
    assert not r.passed and "MemoryError" in r.detail


def test_a_file_larger_than_the_limit_is_refused() -> None:
    limits = SandboxLimits(timeout_s=5.0, file_size_kb=64)
    r = run_python("open('big', 'w').write('x' * 2**20)\n", limits)
    assert not r.passed and "File too large" in r.detail


def test_endless_output_is_capped() -> None:
    r = run_python("while True:\n    print('x' * 1000)\n", SandboxLimits(file_size_kb=64))
    assert not r.passed


@pytest.fixture
def listener() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.5)
    yield srv, srv.getsockname()[1]
    srv.close()


def _no_connection(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except TimeoutError:
        return True
    conn.close()
    return False


def test_opening_a_socket_is_refused(listener: tuple[socket.socket, int]) -> None:
    srv, port = listener
    code = f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\n"
    r = run_python(code, FAST)
    assert not r.passed and "socket.__new__ refused" in r.detail
    assert _no_connection(srv)


@pytest.mark.skipif(not HAS_NAMESPACES, reason="no network namespace here (unshare)")
def test_without_the_guard_the_network_namespace_still_reaches_nothing(
    listener: tuple[socket.socket, int],
) -> None:
    srv, port = listener
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
    r = run_python(code, SandboxLimits(timeout_s=5.0, guard=False, isolation="required"))
    assert not r.passed and ("OSError" in r.detail or "Error" in r.detail)
    assert _no_connection(srv)


def test_required_isolation_fails_clearly_when_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox, "_probe_cache", {})
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="isolation: required"):
        run_python("pass\n", SandboxLimits(isolation="required"))
    assert namespace_prefix("auto") == []  # auto runs without them
    assert run_python("pass\n", FAST).passed
    assert isolation_description(FAST)["namespaces"] == "none"
