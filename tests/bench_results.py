"""Benchmark results built from hand-made request records, for the harness and report tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specserve.bench.inputs import BenchConfig, ClosedLoop
from specserve.bench.records import ChunkRecord, RequestRecord
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


def streamed_record(
    i: int, label: str, send_ns: int, chunks: Sequence[ChunkRecord], **fields: Any
) -> RequestRecord:
    """Request ``i`` of arm ``label`` sent at ``send_ns`` whose tokens came as ``chunks``
    (category ``c``; ``fields`` override the rest, e.g. ``batch`` or ``error``)."""
    values: dict[str, Any] = {
        "request_id": i,
        "arm": label,
        "prompt_id": f"p{i}",
        "category": "c",
        "scheduled_ns": send_ns,
        "send_ns": send_ns,
        "done_ns": chunks[-1].t_ns,
        "chunks": list(chunks),
        "usage_completion_tokens": chunks[-1].usage_completion_tokens,
    }
    return RequestRecord(**{**values, **fields})
