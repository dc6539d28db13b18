"""Run benchmarks: one arm (closed or open loop), concurrency sweeps, and A/B runs.

Public API (the experiment/tune commands build on it):
    run_benchmark(spec) -> BenchResult
    run_sweep(spec, concurrencies) -> list[BenchResult]
    run_ab(specs, batch_size) -> list[BenchResult]   (arms alternate batch by batch)
An A/B run never drives two arms at once from one client: arm batches alternate in ABBA
order (A B B A A B ...) so slow drifts of the machine hit both arms alike. With
``batch_size=1`` at concurrency 1 that is request-level interleaving.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from tqdm import tqdm

from specserve.bench.arm import Arm
from specserve.bench.inputs import BenchConfig, ClosedLoop
from specserve.bench.loadcheck import check_load
from specserve.bench.metrics import derive, summarize
from specserve.bench.records import RequestRecord
from specserve.bench.results import ALL, BenchResult, Manifest
from specserve.bench.scrape import Acceptance
from specserve.bench.workloads import load_workload, prompt_set_hash

logger = logging.getLogger(__name__)


def run_benchmark(spec: BenchConfig) -> BenchResult:
    """Run one arm at one load point (warm-up first, then the measured requests)."""
    return run_ab([spec], batch_size=None)[0]


def run_sweep(spec: BenchConfig, concurrencies: Sequence[int]) -> list[BenchResult]:
    """``spec`` at each closed-loop concurrency, one after the other."""
    return [
        run_benchmark(spec.model_copy(update={"load": ClosedLoop(concurrency=c)}))
        for c in concurrencies
    ]


def run_ab(specs: Sequence[BenchConfig], batch_size: int | None) -> list[BenchResult]:
    """Run arms alternately in batches of ``batch_size`` measured requests (ABBA order).

    All arms must share the workload, sampling, load and bounds (they differ in endpoint);
    ``batch_size=None`` runs each arm in a single batch (one arm: a plain run).
    """
    if not specs:
        raise ValueError("no arms")
    first = specs[0]
    shared = ("workload", "sampling", "load", "num_requests", "duration_s", "warmup_requests")
    for s in specs[1:]:
        for field in shared:
            if getattr(s, field) != getattr(first, field):
                raise ValueError(f"arms differ in {field}: A/B arms must share it")
    if len({s.label for s in specs}) != len(specs):
        raise ValueError("arm labels must be distinct")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return asyncio.run(_run_arms(list(specs), batch_size))


async def _run_arms(specs: list[BenchConfig], batch_size: int | None) -> list[BenchResult]:
    prompts = load_workload(specs[0].workload)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    t0_ns = time.perf_counter_ns()
    arms = [Arm(s, prompts, t0_ns) for s in specs]
    spec = specs[0]
    total = spec.num_requests
    bar = tqdm(
        total=(total * len(arms)) if total else None,
        disable=not spec.progress,
        file=sys.stderr,
        unit="req",
        desc="bench",
    )
    try:
        for arm in arms:
            await arm.fetch_server_info()
            arm.on_done = lambda r: bar.update(0 if r.warmup else 1)
            if spec.warmup_requests:
                await arm.run_batch(spec.warmup_requests, None, warmup=True, batch=-1)
        size = batch_size or total or sys.maxsize
        batch, order = 0, arms
        while not all(arm.finished() for arm in arms):
            for arm in order:
                if not arm.finished():
                    count = min(size, total - arm.num_measured) if total else size
                    await arm.run_batch(count, spec.duration_s, warmup=False, batch=batch)
            batch += 1
            order = order[::-1]
    finally:
        bar.close()
        for arm in arms:
            await arm.client.aclose()
    return [
        _result(
            arm, prompts_hash=prompt_set_hash(prompts), num_prompts=len(prompts), started=started
        )
        for arm in arms
    ]


def _result(arm: Arm, prompts_hash: str, num_prompts: int, started: str) -> BenchResult:
    acceptance = (
        Acceptance.from_delta(arm.spec_delta)
        if arm.scrape_error is None
        else Acceptance(available=False, note=arm.scrape_error)
    )
    manifest = Manifest(
        spec=arm.spec.model_dump(mode="json"),
        server_models=arm.server_models,
        server_info_error=arm.server_info_error,
        prompt_set_hash=prompts_hash,
        num_prompts=num_prompts,
        started_at=started,
        t0_perf_counter_ns=arm.t0_ns,
    )
    return result_from_records(arm.spec, arm.records, acceptance, manifest)


@functools.lru_cache(maxsize=4)
def token_counter(name: str) -> Callable[[str], int]:
    """``text -> number of tokens`` under the tokenizer of model ``name`` (loaded once)."""
    from specserve.loading import load_tokenizer

    tokenizer = load_tokenizer(name)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def result_from_records(
    spec: BenchConfig, records: Sequence[RequestRecord], acceptance: Acceptance, manifest: Manifest
) -> BenchResult:
    """Derive metrics of ``records`` and summarise them into the result of ``spec``'s arm."""
    count = token_counter(spec.tokenizer) if spec.tokenizer else None
    records = [derive(r, count) for r in records]
    measured = [r for r in records if not r.warmup]
    by_cat: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in measured:
        by_cat[r.category].append(r)
    summary = {ALL: summarize(measured)} | {c: summarize(rs) for c, rs in sorted(by_cat.items())}
    window_ns = 0
    batches: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in measured:
        batches[r.batch].append(r)
    for recs in batches.values():
        window_ns += max(r.done_ns or r.send_ns for r in recs) - min(r.send_ns for r in recs)
    window_s = window_ns / 1e9
    ok = [r for r in measured if r.ok]
    if isinstance(spec.load, ClosedLoop):
        load_kind, target = "concurrency", float(spec.load.concurrency)
    else:
        load_kind, target = "rate", spec.load.rate_rps
    load_check = check_load(measured, load_kind, target, spec.max_drift)
    if load_check.flagged:
        logger.warning(
            "%s: achieved %s %.3g vs target %.3g (drift %+.1f%%)",
            spec.label,
            load_kind,
            load_check.achieved or 0.0,
            target,
            100 * (load_check.drift or 0.0),
        )
    return BenchResult(
        label=spec.label,
        concurrency=spec.load.concurrency if isinstance(spec.load, ClosedLoop) else None,
        rate_rps=None if isinstance(spec.load, ClosedLoop) else spec.load.rate_rps,
        manifest=manifest,
        load_check=load_check,
        window_s=window_s,
        output_throughput_tps=sum(r.num_tokens for r in ok) / window_s if window_s > 0 else 0.0,
        request_rate_rps=len(measured) / window_s if window_s > 0 else 0.0,
        summary=summary,
        acceptance=acceptance,
        records=records,
    )
