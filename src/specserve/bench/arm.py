"""One arm of a benchmark: its client, prompt cursor, records and counter deltas.

Closed loop: ``concurrency`` workers each send their next request when the last one ended.
Open loop: a scheduler sends at the arrival offsets; with ``max_concurrency`` a request waits
for a slot, and that wait is its client queueing time (``send − scheduled``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from specserve.bench.arrivals import arrival_offsets_s
from specserve.bench.client import StreamClient, request_body
from specserve.bench.inputs import BenchConfig, ClosedLoop
from specserve.bench.records import RequestRecord
from specserve.bench.scrape import SpecCounters, parse_prometheus
from specserve.bench.workloads import Prompt


class Arm:
    """State of one arm across its batches."""

    def __init__(self, spec: BenchConfig, prompts: list[Prompt], t0_ns: int) -> None:
        self.spec = spec
        self.prompts = prompts
        self.t0_ns = t0_ns
        load = spec.load
        cap = load.concurrency if isinstance(load, ClosedLoop) else (load.max_concurrency or 1000)
        self.client = StreamClient(spec.root_url, max(cap, 1), spec.timeout_s)
        self.records: list[RequestRecord] = []
        self.num_measured = 0
        self.measured_ns = 0
        self.spec_delta = SpecCounters()
        self.scrape_error: str | None = None
        self.server_models: dict | None = None
        self.server_info_error: str | None = None
        self.on_done: Callable[[RequestRecord], object] = lambda r: None
        self._cursor = {True: 0, False: 0}  # next prompt index, per warm-up flag

    def finished(self) -> bool:
        s = self.spec
        if s.num_requests is not None and self.num_measured >= s.num_requests:
            return True
        return s.duration_s is not None and self.measured_ns >= s.duration_s * 1e9

    async def fetch_server_info(self) -> None:
        try:
            self.server_models = await self.client.get_json("/v1/models")
        except (httpx.HTTPError, ValueError) as e:
            self.server_info_error = f"GET /v1/models: {type(e).__name__}: {e}"

    async def _scrape(self) -> SpecCounters | None:
        url = self.spec.resolved_metrics_url
        if url is None:
            self.scrape_error = "metrics scraping disabled"
            return None
        try:
            return SpecCounters.from_samples(parse_prometheus(await self.client.get_text(url)))
        except (httpx.HTTPError, ValueError) as e:
            self.scrape_error = f"scrape {url}: {type(e).__name__}: {e}"
            return None

    def _next(self, warmup: bool, scheduled_ns: int, batch: int) -> tuple[RequestRecord, dict]:
        index = self._cursor[warmup]
        self._cursor[warmup] += 1
        prompt = self.prompts[index % len(self.prompts)]
        load = self.spec.load
        record = RequestRecord(
            request_id=index,
            arm=self.spec.label,
            concurrency=load.concurrency if isinstance(load, ClosedLoop) else None,
            rate_rps=None if isinstance(load, ClosedLoop) else load.rate_rps,
            prompt_id=prompt.id,
            category=prompt.category,
            warmup=warmup,
            batch=batch,
            scheduled_ns=scheduled_ns,
            send_ns=scheduled_ns,
        )
        body = request_body(prompt, self.spec.model, self.spec.endpoint, self.spec.sampling)
        body |= self.spec.extra_body
        record.max_tokens = body.get("max_tokens")
        return record, body

    def _now(self) -> int:
        return time.perf_counter_ns() - self.t0_ns

    async def _send(self, record: RequestRecord, body: dict) -> None:
        self.records.append(record)
        await self.client.send(record, body, self.spec.endpoint, self.t0_ns)
        self.on_done(record)

    async def run_batch(
        self, count: int, duration_s: float | None, warmup: bool, batch: int
    ) -> None:
        """Send ``count`` requests (or until the arm's measured time reaches ``duration_s``)."""
        before = None if warmup else await self._scrape()
        start = self._now()
        deadline = None
        if duration_s is not None and not warmup:
            deadline = start + int(duration_s * 1e9) - self.measured_ns
        load = self.spec.load
        sent = 0
        if isinstance(load, ClosedLoop) or warmup:
            width = load.concurrency if isinstance(load, ClosedLoop) else load.max_concurrency or 1

            async def worker() -> None:
                nonlocal sent
                while sent < count and (deadline is None or self._now() < deadline):
                    sent += 1
                    await self._send(*self._next(warmup, self._now(), batch))

            await asyncio.gather(*(worker() for _ in range(min(width, count))))
        else:
            slots = asyncio.Semaphore(load.max_concurrency or 1_000_000)
            horizon = None if deadline is None else (deadline - start) / 1e9

            async def gated(record: RequestRecord, body: dict) -> None:
                async with slots:
                    await self._send(record, body)

            tasks = []
            for offset in arrival_offsets_s(load, count, horizon):
                at = start + int(offset * 1e9)
                await asyncio.sleep(max(0.0, (at - self._now()) / 1e9))
                tasks.append(asyncio.create_task(gated(*self._next(warmup, at, batch))))
            await asyncio.gather(*tasks)
            sent = len(tasks)
        if not warmup:
            if deadline is not None and sent < count:  # stopped by the clock: budget spent
                self.measured_ns = int(duration_s * 1e9) if duration_s is not None else 0
            else:
                self.measured_ns += self._now() - start
            self.num_measured += sum(1 for r in self.records if r.batch == batch)
            after = await self._scrape() if before is not None else None
            if before is not None and after is not None:
                self.spec_delta = self.spec_delta.plus(after.minus(before))
