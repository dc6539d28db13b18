"""Cost per output token and the candidate's saving with its bootstrap CI."""

from __future__ import annotations

import random

import pytest

from specserve.bench.compare import compare
from specserve.bench.cost import saving_ci, window_shares
from specserve.bench.pricing import resolve_pricing
from specserve.bench.records import ChunkRecord
from specserve.bench.results import BenchResult
from tests.bench_results import closed_loop_result, streamed_record

MS = 1_000_000


def sequential(label: str, ms_per_token: float, n: int = 30, seed: int = 0) -> BenchResult:
    """Requests one after another (one batch each, as an A/B at concurrency 1), 20 tokens
    each, every token ``ms_per_token`` (±10 %); every 10th request fails halfway."""
    rng = random.Random(seed)
    records, t = [], 0
    for i in range(n):
        send, chunks, done = t, [], 0
        for k in range(20):
            t += int(ms_per_token * rng.uniform(0.9, 1.1) * MS)
            done = k + 1
            chunks.append(
                ChunkRecord(t_ns=t, num_chars=1, usage_completion_tokens=done, has_choice=True)
            )
        failed = i % 10 == 9
        records.append(
            streamed_record(i, label, send, chunks, batch=i, error="dropped" if failed else None)
        )
        t += 5 * MS  # gap between batches: not in the window
    return closed_loop_result(label, records, n)


def test_window_shares_add_up_to_the_window() -> None:
    res = sequential("a", 10)
    tokens, shares = window_shares(res.records)
    assert shares.sum() == pytest.approx(res.window_s)
    assert tokens.sum() / shares.sum() == pytest.approx(res.output_throughput_tps)
    assert tokens.sum() == 27 * 20  # failed requests bring time, not tokens


def test_twice_the_throughput_halves_the_cost() -> None:
    base, cand = sequential("base", 20), sequential("spec", 10, seed=1)
    point, low, high = saving_ci(base, cand)
    assert point == pytest.approx(1 - base.output_throughput_tps / cand.output_throughput_tps)
    assert point == pytest.approx(0.5, abs=0.03)
    assert low is not None and high is not None and 0 < low < point < high < 1
    assert saving_ci(base, cand, seed=3) == saving_ci(base, cand, seed=3)
    same_low, same_high = saving_ci(base, sequential("b2", 20, seed=2))[1:]
    assert same_low is not None and same_high is not None and same_low < 0 < same_high


def test_comparison_prices_each_arm_and_the_saving_does_not_depend_on_it() -> None:
    base, cand = sequential("base", 20), sequential("spec", 10, seed=1)
    unpriced = compare([base, cand]).cost[0]
    priced = compare([base, cand], pricing=resolve_pricing("p5.48xlarge")).cost[0]
    assert unpriced.baseline_usd_per_mtok is None and unpriced.price_per_hour is None
    assert (priced.saving, priced.ci_low, priced.ci_high) == (
        unpriced.saving,
        unpriced.ci_low,
        unpriced.ci_high,
    )
    assert priced.load == "c1" and (priced.baseline, priced.candidate) == ("base", "spec")
    assert priced.baseline_usd_per_mtok == pytest.approx(
        55.04 / 3600 / base.output_throughput_tps * 1e6
    )
    assert priced.candidate_usd_per_mtok is not None
    assert priced.saving == pytest.approx(
        1 - priced.candidate_usd_per_mtok / priced.baseline_usd_per_mtok
    )
    assert priced.num_requests_baseline == 30
