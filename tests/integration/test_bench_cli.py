"""``specserve bench`` and ``specserve compare`` as a user runs them (mock servers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.bench.mock_server import MockConfig, serve_in_thread
from specserve.bench.results import load_result
from specserve.cli import main


def test_bench_ab_sweep_then_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ab"
    with (
        serve_in_thread(MockConfig(ttft_ms=3, itl_ms=2, output_tokens=10)) as a,
        serve_in_thread(
            MockConfig(ttft_ms=3, itl_ms=1, output_tokens=10, tokens_per_chunk=2, spec_k=2)
        ) as b,
    ):
        rc = main(
            [
                "bench",
                "--baseline",
                f"http://127.0.0.1:{a.port}",
                "--candidate",
                f"http://127.0.0.1:{b.port}/v1",
                "--model",
                "mock-model",
                "--suite",
                "structured",
                "--suite",
                "open-ended",
                "--categories",
                "repeat,prose",
                "--sweep-concurrency",
                "1,2",
                "--num-requests",
                "6",
                "--warmup",
                "2",
                "--max-tokens",
                "8",
                "--output",
                str(out),
                "--no-progress",
            ]
        )
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "| candidate | c2 |" in stdout and f"results in {out}" in stdout
    for d in ("baseline-c1", "candidate-c1", "baseline-c2", "candidate-c2"):
        assert {p.name for p in (out / d).iterdir()} == {
            "result.json",
            "summary.json",
            "requests.jsonl",
        }
        lines = (out / d / "requests.jsonl").read_text().splitlines()
        assert len(lines) == 8 and sum(json.loads(x)["warmup"] for x in lines) == 2
    for f in ("report.html", "report.md", "emf.jsonl", "comparison.json"):
        assert (out / f).stat().st_size > 0
    cand = load_result(out / "candidate-c1")
    assert cand.manifest.spec["sampling"]["max_tokens"] == 8
    assert all(r.num_tokens == 8 for r in cand.measured())
    assert cand.acceptance.mean_acceptance_length == pytest.approx(2.0)

    rc = main(
        [
            "compare",
            str(out / "baseline-c1"),
            str(out / "candidate-c1" / "result.json"),
            "--output",
            str(tmp_path / "cmp"),
            "--instance",
            "p5.48xlarge",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| c1 | * | itl_s |" in printed
    cost_row = next(ln for ln in printed.splitlines() if ln.startswith("| c1 | candidate |"))
    assert "$" in cost_row and cost_row.rstrip(" |").endswith("]")  # $/1M and saving [CI]
    assert "p5.48xlarge: $55.04/h" in (tmp_path / "cmp" / "report.md").read_text()
    assert (tmp_path / "cmp" / "report.html").is_file()


def test_bench_single_endpoint_open_loop(tmp_path: Path) -> None:
    with serve_in_thread(MockConfig(ttft_ms=2, itl_ms=1, output_tokens=4)) as a:
        rc = main(
            [
                "bench",
                "--base-url",
                f"http://127.0.0.1:{a.port}",
                "--model",
                "m",
                "--endpoint",
                "completions",
                "--suite",
                "llmperf",
                "--llmperf-input-tokens",
                "120",
                "--rate",
                "20",
                "--arrival",
                "constant",
                "--duration",
                "0.5",
                "--output",
                str(tmp_path / "o"),
                "--no-progress",
                "--label",
                "solo",
            ]
        )
    assert rc == 0
    result = load_result(tmp_path / "o" / "solo-r20")
    assert result.rate_rps == 20 and len(result.measured()) == 10
    assert not (tmp_path / "o" / "comparison.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "m"], "give --base-url"),
        (["--model", "m", "--baseline", "http://x"], "both --baseline and --candidate"),
        (["--model", "m", "--base-url", "http://x", "--max-concurrency", "2"], "(open loop) only"),
        (["--model", "m", "--base-url", "x:1"], "http://"),
        (["--model", "m", "--base-url", "http://x", "--suite", "nope"], "unknown suite"),
        (
            ["--model", "m", "--base-url", "http://x", "--tokenizer", "no-such-model"],
            "--tokenizer: model 'no-such-model' is neither a catalog name",
        ),
    ],
)
def test_bench_bad_arguments(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *args, "--output", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_compare_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "missing.json")]) == 2
    assert "no result file" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text('{"label": "x"}')
    assert main(["compare", str(tmp_path / "summary.json")]) == 2
    assert "per-request records" in capsys.readouterr().err


def test_bad_prices_are_refused_before_any_request(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compare", "missing.json", "--instance", "m7.huge"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown instance 'm7.huge'; known: local, trn2.48xlarge" in err
    # port 9 (discard) is never contacted: the price is checked first
    rc = main(
        ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--price-per-hour", "-3"]
    )
    assert rc == 2 and "price per hour must be >= 0, got -3" in capsys.readouterr().err
