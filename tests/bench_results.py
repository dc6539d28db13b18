"""Benchmark results built from hand-made request records, for the harness and report tests."""

from __future__ import annotations

from collections.abc import Sequence

from specserve.bench.inputs import BenchConfig, ClosedLoop
from specserve.bench.records import RequestRecord
from specserve.bench.results import BenchResult, Manifest
from specserve.bench.runner import result_from_records
from specserve.bench.scrape import Acceptance


def closed_loop_result(
    label: str,
    records: Sequence[RequestRecord],
    num_requests: int,
    concurrency: int = 1,
    num_prompts: int | None = None,
) -> BenchResult:
    """The result of a closed-loop arm that recorded ``records`` (no acceptance counters)."""
    config = BenchConfig(
        base_url="http://x",
        model="m",
        label=label,
        num_requests=num_requests,
        load=ClosedLoop(concurrency=concurrency),
    )
    manifest = Manifest(
        spec={},
        prompt_set_hash="h",
        num_prompts=num_requests if num_prompts is None else num_prompts,
        started_at="now",
    )
    return result_from_records(config, list(records), Acceptance(available=False), manifest)
