"""``specserve bench`` as a new user runs it, against a real ``specserve serve`` process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specserve.bench.results import load_result
from specserve.server.launcher import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"


def test_bench_against_specserve_serve_ngram(tmp_path: Path) -> None:
    args = [
        "--model",
        MODEL,
        "--spec-method",
        "ngram",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        "4",
    ]
    with ServerProcess(args, log_path=tmp_path / "server.log") as server:
        out = tmp_path / "bench"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "specserve.cli",
                "bench",
                "--base-url",
                server.base_url,
                "--model",
                MODEL,
                "--suite",
                "structured",
                "--categories",
                "repeat,counting",
                "--concurrency",
                "2",
                "--num-requests",
                "4",
                "--warmup",
                "1",
                "--max-tokens",
                "24",
                "--output",
                str(out),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:] + server.log_tail()
    result = load_result(out / "run-c2")
    recs = result.measured()
    assert len(recs) == 4 and all(r.ok for r in recs), [r.error for r in recs]
    for r in recs:
        assert 1 <= r.num_tokens <= 24 and r.ttft_s is not None and r.e2e_s is not None
        assert r.ttft_s <= r.e2e_s and sum(r.tokens_per_chunk) == r.num_tokens
        assert not r.tokens_estimated  # the server reports usage
    assert result.manifest.server_models is not None
    assert result.acceptance.available, result.acceptance.note
    assert (out / "report.html").is_file()
