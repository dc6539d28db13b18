"""`specserve experiment` against two running endpoints (mock OpenAI servers): nothing is
started, both arms are benchmarked alternately, and the results folder holds everything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specserve.bench.mock_server import MockConfig, serve_in_thread
from specserve.cli import main
from tests.mock_endpoints import mock_endpoints


def test_experiment_on_endpoints_writes_results(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    base_cfg = MockConfig(ttft_ms=5, itl_ms=6, tokens_per_chunk=1, output_tokens=12)
    spec_cfg = MockConfig(ttft_ms=5, itl_ms=2, tokens_per_chunk=3, output_tokens=12, spec_k=3)
    with serve_in_thread(base_cfg) as base, serve_in_thread(spec_cfg) as spec:
        cfg = {
            "name": "mock-ab",
            "output_dir": str(tmp_path / "out"),
            "endpoints": mock_endpoints(base.port, spec.port),
            "benchmark": {"num_requests": 4, "warmup_requests": 1, "max_tokens": 12},
        }
        path = tmp_path / "exp.yaml"
        path.write_text(yaml.safe_dump(cfg))
        assert main(["experiment", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "TPOT speedup" in printed
    out = tmp_path / "out"
    for suite in ("structured", "open-ended"):
        for arm in ("baseline", "speculative"):
            result = json.loads((out / "runs" / "c1" / suite / arm / "result.json").read_text())
            measured = [r for r in result["records"] if not r["warmup"]]
            assert len(measured) == 4
            assert all(r["error"] is None for r in measured)
    comparison = json.loads((out / "comparison.json").read_text())
    assert set(comparison) == {"c1/structured", "c1/open-ended"}
    headline = (out / "headline.md").read_text()
    assert headline.count("\n| 1 |") >= 2
    # The speculative mock streams 3 tokens per chunk at a third of the per-token delay;
    # the table must show its acceptance (from the mock's vLLM-named counters) and a speedup.
    row = next(ln for ln in headline.splitlines() if ln.startswith("| 1 | "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[4].split("×")[0]) > 1.5
    assert cells[10] != "–"
    assert (out / "config.yaml").is_file()
    index = (out / "report.html").read_text()
    assert "runs/c1/structured/report.html" in index
    for suite in ("structured", "open-ended"):
        assert "<svg" in (out / "runs" / "c1" / suite / "report.html").read_text()


def test_sweep_with_rates_prices_both_arms_and_leads_with_the_verdict(
    tmp_path: Path,
    capsys,  # type: ignore[no-untyped-def]
) -> None:
    base_cfg = MockConfig(ttft_ms=5, itl_ms=6, tokens_per_chunk=1, output_tokens=12)
    spec_cfg = MockConfig(ttft_ms=5, itl_ms=2, tokens_per_chunk=3, output_tokens=12, spec_k=3)
    with serve_in_thread(base_cfg) as base, serve_in_thread(spec_cfg) as spec:
        cfg = {
            "name": "mock-sweep",
            "output_dir": str(tmp_path / "out"),
            "endpoints": mock_endpoints(base.port, spec.port),
            "benchmark": {
                "suites": ["structured"],
                "concurrency": [1, 2],
                "rates": [20, 40],
                "num_requests": 6,
                "warmup_requests": 1,
                "batch_size": 3,
                "max_tokens": 12,
            },
            "cost": {"instance": "g6e.xlarge"},
            "quality": None,  # the verdict then says "not run" (the quality flow: its own test)
        }
        path = tmp_path / "exp.yaml"
        path.write_text(yaml.safe_dump(cfg))
        assert main(["experiment", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "Verdict (structured): " in printed and "g6e.xlarge: $1.861/h" in printed
    out = tmp_path / "out"
    comparison = json.loads((out / "comparison.json").read_text())
    assert set(comparison) == {f"{load}/structured" for load in ("c1", "c2", "r20", "r40")}
    for load in ("r20", "r40"):  # open loop: Poisson arrivals, one batch per arm
        result = json.loads(
            (out / "runs" / load / "structured" / "speculative" / "result.json").read_text()
        )
        assert result["rate_rps"] == float(load[1:]) and result["concurrency"] is None
        measured = [r for r in result["records"] if not r["warmup"]]
        assert len(measured) == 6 and {r["batch"] for r in measured} == {0}
        cost = comparison[f"{load}/structured"]["cost"][0]
        assert cost["baseline_usd_per_mtok"] == pytest.approx(
            1.861 / 3600 / cost["baseline_tps"] * 1e6
        )
    headline = (out / "headline.md").read_text()
    row = next(ln for ln in headline.splitlines() if ln.startswith("| r20 | structured (all)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[14].startswith("$") and cells[15].endswith("]")  # $/1M per arm, saving [CI]
    index = (out / "report.html").read_text()
    assert "<script" not in index
    verdict, curve, details = (
        index.index(s) for s in ("id='verdict'", "id='curve'", "id='details'")
    )
    assert verdict < curve < details  # the answer first, then the curve, then the details
    assert "Quality:</b> <span class='notrun'>not run</span>" in index
    assert "TPOT vs throughput — structured (concurrency sweep)" in index
    assert "TPOT vs throughput — structured (rate sweep)" in index
    assert "E2E latency of each request — structured, r40" in index
    assert "runs/r20/structured/report.html" in index
    emf = [
        json.loads(x)
        for x in (out / "runs" / "c1" / "structured" / "emf.jsonl").read_text().splitlines()
    ]
    assert any("CostPerMillionOutputTokens" in x and x["Variant"] == "speculative" for x in emf)
