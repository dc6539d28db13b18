"""Benchmark and A/B harness: speaks HTTP only (never imports the engine or the server).

Python API::

    from specserve.bench import BenchConfig, ClosedLoop, run_benchmark, compare
    result = run_benchmark(BenchConfig(base_url="http://127.0.0.1:8000", model="m",
                                     load=ClosedLoop(concurrency=4), num_requests=32))
    comparison = compare([baseline_result, candidate_result])
    write_report([baseline_result, candidate_result], comparison, "out/")
"""

from specserve.bench.compare import Comparison, compare
from specserve.bench.inputs import (
    BenchConfig,
    ClosedLoop,
    LlmperfConfig,
    OpenLoop,
    SamplingConfig,
    WorkloadConfig,
)
from specserve.bench.results import BenchResult, load_result, save_result
from specserve.bench.runner import run_ab, run_benchmark, run_sweep

__all__ = [
    "BenchConfig",
    "BenchResult",
    "ClosedLoop",
    "Comparison",
    "LlmperfConfig",
    "OpenLoop",
    "SamplingConfig",
    "WorkloadConfig",
    "compare",
    "load_result",
    "run_ab",
    "run_benchmark",
    "run_sweep",
    "save_result",
]
