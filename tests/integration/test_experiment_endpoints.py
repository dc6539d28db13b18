"""`specserve experiment` against two running endpoints (mock OpenAI servers): nothing is
started, both arms are benchmarked alternately, and the results folder holds everything."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from specserve.bench.mock_server import MockConfig, serve_in_thread
from specserve.cli import main


def test_experiment_on_endpoints_writes_results(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    base_cfg = MockConfig(ttft_ms=5, itl_ms=6, tokens_per_chunk=1, output_tokens=12)
    spec_cfg = MockConfig(ttft_ms=5, itl_ms=2, tokens_per_chunk=3, output_tokens=12, spec_k=3)
    with serve_in_thread(base_cfg) as base, serve_in_thread(spec_cfg) as spec:
        cfg = {
            "name": "mock-ab",
            "output_dir": str(tmp_path / "out"),
            "endpoints": {
                "baseline": {"base_url": f"http://127.0.0.1:{base.port}", "model": "mock-model"},
                "speculative": {"base_url": f"http://127.0.0.1:{spec.port}", "model": "mock-model"},
            },
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
