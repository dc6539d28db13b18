"""A/B comparison: speedup as ratio of medians, bootstrap CI, regressions, parity."""

from __future__ import annotations

import random

import pytest

from specserve.bench.compare import bootstrap_ratio, compare
from specserve.bench.records import ChunkRecord, RequestRecord
from specserve.bench.results import BenchResult
from tests.bench_results import closed_loop_result

MS = 1_000_000


def synthetic(
    label: str,
    itl_ms: float,
    tokens_per_chunk: int,
    n: int = 40,
    seed: int = 0,
    text: str = "x",
    error_every: int = 0,
    concurrency: int = 1,
) -> BenchResult:
    """Requests with TTFT ≈ 50 ms and per-token ITL ≈ itl_ms (±10 % noise), 24 tokens each."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        t, done, chunks = 50.0 * rng.uniform(0.9, 1.1), 0, []
        while done < 24:
            k = min(tokens_per_chunk, 24 - done)
            if done:
                t += k * itl_ms * rng.uniform(0.9, 1.1)
            done += k
            chunks.append(
                ChunkRecord(
                    t_ns=int(t * MS),
                    num_chars=k,
                    usage_completion_tokens=done,
                    has_choice=True,
                    text=text * k,
                )
            )
        err = "HTTP 500" if error_every and i % error_every == 0 else None
        records.append(
            RequestRecord(
                request_id=i,
                arm=label,
                prompt_id=f"p{i % 4}",
                category=f"cat{i % 2}",
                scheduled_ns=0,
                send_ns=0,
                done_ns=int(t * MS),
                chunks=chunks,
                usage_completion_tokens=done,
                output_text=text * done,
                output_sha256=text,
                error=err,
            )
        )
    return closed_loop_result(label, records, n, concurrency, num_prompts=4)


def test_speedup_ci_covers_the_true_ratio() -> None:
    base = synthetic("base", itl_ms=30, tokens_per_chunk=1)
    cand = synthetic("spec", itl_ms=10, tokens_per_chunk=3, seed=1)
    cmp = compare([base, cand])
    row = next(r for r in cmp.rows if r.category == "*" and r.load == "c1")
    itl = next(m for m in row.metrics if m.metric == "itl_s")
    assert itl.speedup == pytest.approx(3.0, rel=0.08)
    assert itl.ci_low is not None and itl.ci_high is not None
    assert itl.ci_low < itl.speedup < itl.ci_high and itl.ci_low < 3.0 < itl.ci_high * 1.02
    assert itl.n_baseline == 40 * 23 and itl.n_candidate == 40 * 24 - 40 * 3
    ttft = next(m for m in row.metrics if m.metric == "ttft_s")
    assert ttft.ci_low is not None and ttft.ci_high is not None
    assert ttft.ci_low < 1.0 < ttft.ci_high and not ttft.regression  # TTFT unchanged
    assert not row.regression and cmp.regressions == []
    assert [r.category for r in cmp.rows] == ["*", "cat0", "cat1"]


def test_slower_candidate_is_flagged() -> None:
    cmp = compare([synthetic("base", 10, 1), synthetic("slow", 20, 1, seed=2)])
    row = cmp.rows[0]
    assert row.regression
    assert any("slow slower on itl_s" in note for note in cmp.regressions)


def test_more_errors_is_flagged() -> None:
    cmp = compare([synthetic("base", 10, 1), synthetic("err", 10, 1, error_every=4)])
    assert cmp.rows[0].error_rate_candidate == pytest.approx(0.25)
    assert any("error rate" in note for note in cmp.regressions)


def test_parity_and_exact_match() -> None:
    same = compare([synthetic("a", 10, 1, text="x"), synthetic("b", 10, 2, text="x")]).rows[0]
    assert same.exact_match_rate == 1.0 and same.length_parity == 1.0 and same.num_pairs == 40
    diff = compare([synthetic("a", 10, 1, text="x"), synthetic("b", 10, 2, text="y")]).rows[0]
    assert diff.exact_match_rate == 0.0 and diff.length_match_rate == 1.0


def test_different_prompt_sets_are_noted() -> None:
    other = synthetic("b", 10, 1)
    other.manifest.prompt_set_hash = "other"
    cmp = compare([synthetic("a", 10, 1), other])
    assert any("different prompt set" in note for note in cmp.regressions)


def test_bootstrap_is_seeded() -> None:
    rng = random.Random(0)
    base = [[rng.random()] for _ in range(50)]
    cand = [[rng.random() * 0.5] for _ in range(50)]
    assert bootstrap_ratio(base, cand, False, seed=7) == bootstrap_ratio(base, cand, False, seed=7)
    assert bootstrap_ratio(base, cand, False, seed=7) != bootstrap_ratio(base, cand, False, seed=8)
    assert bootstrap_ratio([], cand, False) == (None, None, None)


def test_loads_pair_up_and_bad_inputs() -> None:
    results = [
        synthetic("base", 10, 1, concurrency=1),
        synthetic("spec", 5, 2, concurrency=1),
        synthetic("base", 10, 1, concurrency=4),
        synthetic("spec", 5, 2, concurrency=4),
    ]
    cmp = compare(results)
    assert {r.load for r in cmp.rows} == {"c1", "c4"}
    assert set(cmp.throughput["c4"]) == {"base", "spec"}
    with pytest.raises(ValueError, match="no result labelled"):
        compare(results, baseline="nope")
    with pytest.raises(ValueError, match="two results labelled"):
        compare([results[0], results[0]])
    with pytest.raises(ValueError, match="nothing"):
        compare([])


def test_infinite_ratios_give_no_nan_bounds() -> None:
    # half the candidate's requests have ITL 0 (chunks stamped by one socket read): some
    # resamples have a zero median, an infinite ratio; the CI must not turn into NaN
    base = [[0.01]] * 20
    cand = [[0.0]] * 10 + [[0.005]] * 10
    point, low, high = bootstrap_ratio(base, cand, False, seed=1)
    assert point is not None and low is not None and low == low  # not NaN
    assert high is None  # unbounded above: reported as unknown
