"""Real benchmark results (from two mock servers) to render."""

from __future__ import annotations

import pytest

from specserve.bench.compare import Comparison, compare
from specserve.bench.inputs import BenchConfig, ClosedLoop, WorkloadConfig
from specserve.bench.mock_server import MockConfig, serve_in_thread
from specserve.bench.results import BenchResult
from specserve.bench.runner import run_ab


@pytest.fixture(scope="session")
def ab_results() -> tuple[list[BenchResult], Comparison]:
    base_cfg = MockConfig(ttft_ms=5, itl_ms=3, output_tokens=12)
    cand_cfg = MockConfig(ttft_ms=5, itl_ms=1, output_tokens=12, tokens_per_chunk=3, spec_k=3)
    results: list[BenchResult] = []
    with serve_in_thread(base_cfg) as a, serve_in_thread(cand_cfg) as b:
        for c in (1, 2):
            specs = [
                BenchConfig(
                    base_url=f"http://127.0.0.1:{server.port}",
                    model="mock-model",
                    label=label,
                    num_requests=8,
                    load=ClosedLoop(concurrency=c),
                    workload=WorkloadConfig(
                        suites=("structured", "open-ended"), categories=("repeat", "prose")
                    ),
                )
                for label, server in (("baseline", a), ("candidate", b))
            ]
            results += run_ab(specs, batch_size=4)
    return results, compare(results)
