"""`specserve tune` end to end on SmolLM2-135M: one baseline server, one server per proposer
(a truncated draft and n-gram), k varied per request, recommendation and report written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e


def test_small_tune_sweep(smollm2: object, tmp_path: Path) -> None:
    cfg = {
        "name": "tiny-tune",
        "output_dir": str(tmp_path / "out"),
        "target": "smollm2-135m-instruct",
        "dtype": "float32",
        "max_model_len": 512,
        "proposers": [
            {"name": "ngram", "method": "ngram"},
            {
                "name": "self-2L",
                "method": "draft",
                "draft": "smollm2-135m-instruct",
                "draft_num_layers": 2,
            },
        ],
        "k": [1, 3],
        "suites": ["structured"],
        "num_requests": 2,
        "warmup_requests": 0,
        "max_tokens": 12,
    }
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "specserve.cli", "tune", str(path)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recommended k=" in proc.stdout
    out = tmp_path / "out"
    data = json.loads((out / "tune.json").read_text())
    points = data["points"]
    assert {p["proposer"] for p in points} == {"ngram", "self-2L"}
    assert {p["k"] for p in points} == {1, 3}
    overall = [p for p in points if p["category"] == "*"]
    assert len(overall) == 4  # 2 proposers x 2 k, plus a row per category
    for p in points:
        assert p["num_requests"] == (2 if p["category"] == "*" else 1)
        assert p["acceptance_rate"] is not None  # per-arm /metrics deltas on a shared server
        assert 0.0 <= p["acceptance_rate"] <= 1.0
    assert data["recommendations"]
    html = (out / "tune.html").read_text()
    assert html.count("<svg") >= 3 and "i.i.d." in html
    for name in ("baseline", "ngram", "self-2L"):
        assert (out / "logs" / f"{name}.log").is_file()
