"""Achieved vs target load."""

from __future__ import annotations

import pytest

from specserve.bench.loadcheck import check_load
from specserve.bench.records import RequestRecord

S = 1_000_000_000


def rec(i: int, send_s: float, done_s: float, scheduled_s: float | None = None) -> RequestRecord:
    sched = send_s if scheduled_s is None else scheduled_s
    return RequestRecord(
        request_id=i,
        arm="a",
        prompt_id="p",
        category="c",
        scheduled_ns=int(sched * S),
        send_ns=int(send_s * S),
        done_ns=int(done_s * S),
    )


def closed_loop(concurrency: int, gap_s: float) -> list[RequestRecord]:
    """Workers each run 5 back-to-back 1-s requests with ``gap_s`` idle between."""
    out, i = [], 0
    for _ in range(concurrency):
        t = 0.0
        for _ in range(5):
            out.append(rec(i, t, t + 1.0))
            i += 1
            t += 1.0 + gap_s
    return out


def test_closed_loop_on_target() -> None:
    lc = check_load(closed_loop(4, 0.0), "concurrency", 4, 0.05)
    assert lc.achieved == pytest.approx(4.0) and not lc.flagged


def test_closed_loop_client_lag_is_flagged() -> None:
    lc = check_load(closed_loop(4, 0.25), "concurrency", 4, 0.05)  # 20 % idle per worker
    assert lc.achieved is not None and lc.achieved < 3.6 and lc.flagged


def test_open_loop_lateness_against_schedule() -> None:
    on_time = [rec(i, i * 0.1, i * 0.1 + 0.5) for i in range(20)]
    lc = check_load(on_time, "rate", 10, 0.05)
    assert lc.achieved == pytest.approx(10) and not lc.flagged
    late = [rec(i, i * 0.2, i * 0.2 + 0.5, scheduled_s=i * 0.1) for i in range(20)]
    lc = check_load(late, "rate", 10, 0.05)
    assert lc.achieved == pytest.approx(5) and lc.reference == pytest.approx(10) and lc.flagged


def test_short_batches_use_peak() -> None:
    recs = [rec(i, 0.0, 1.0) for i in range(3)]
    lc = check_load(recs, "concurrency", 4, 0.05)
    assert lc.achieved == 3 and lc.flagged
