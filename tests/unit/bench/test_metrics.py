"""Metric definitions on hand-built chunk timelines (docs/metrics.md)."""

from __future__ import annotations

import pytest

from specserve.bench.metrics import Distribution, chunk_token_counts, derive, summarize
from specserve.bench.records import ChunkRecord, RequestRecord

MS = 1_000_000


def chunk(t_ms: float, text: str, usage: int | None = None, choice: bool = True) -> ChunkRecord:
    return ChunkRecord(
        t_ns=int(t_ms * MS),
        num_chars=len(text),
        usage_completion_tokens=usage,
        has_choice=choice,
        text=text,
    )


def record(
    chunks: list[ChunkRecord],
    usage: int | None = None,
    send_ms: float = 0.0,
    scheduled_ms: float = 0.0,
    error: str | None = None,
) -> RequestRecord:
    return derive(
        RequestRecord(
            request_id=0,
            arm="a",
            prompt_id="p",
            category="c",
            scheduled_ns=int(scheduled_ms * MS),
            send_ns=int(send_ms * MS),
            chunks=chunks,
            usage_completion_tokens=usage,
            error=error,
        )
    )


def test_continuous_usage_multi_token_chunks() -> None:
    # role chunk (no tokens), then chunks of 3, 3, 2 tokens; final usage-only chunk
    chunks = [
        chunk(5, "", 0),
        chunk(100, " a b c", 3),
        chunk(130, " d e f", 6),
        chunk(150, " g h", 8),
        chunk(151, "", 8, choice=False),
    ]
    r = record(chunks, usage=8, send_ms=10, scheduled_ms=4)
    assert r.tokens_per_chunk == [3, 3, 2]
    assert not r.tokens_estimated and not r.chunk_tokens_estimated
    assert r.num_tokens == 8
    assert r.ttft_s == pytest.approx(0.090)
    assert r.e2e_s == pytest.approx(0.140)  # last *token* chunk, not the usage-only one
    assert r.tpot_s == pytest.approx((0.140 - 0.090) / 7)
    assert r.icl_s == pytest.approx([0.030, 0.020])
    # per-token ITL: each gap divided by the tokens of the chunk ending it, once per token
    assert r.itl_s == pytest.approx([0.010] * 3 + [0.010] * 2)
    assert r.queue_s == pytest.approx(0.006)
    assert r.token_times_s == pytest.approx([0.090, 0.120, 0.140])


def test_empty_chunks_carry_no_tokens() -> None:
    chunks = [chunk(10, "", 0), chunk(20, " a", 1), chunk(25, "", 1), chunk(30, " b", 2)]
    r = record(chunks, usage=2)
    assert r.tokens_per_chunk == [1, 1]
    assert r.ttft_s == pytest.approx(0.020)
    assert r.icl_s == pytest.approx([0.010])


def test_final_usage_only_is_apportioned_by_text_length() -> None:
    chunks = [
        chunk(10, " aa bb"),
        chunk(20, " cc"),
        chunk(30, " dd ee ff"),
        chunk(31, "", 6, choice=False),
    ]
    counts, apportioned, estimated = chunk_token_counts(chunks)
    assert apportioned and not estimated
    assert counts[:3] == [2, 1, 3] and counts[3] == 0
    r = record(chunks, usage=6)
    assert r.num_tokens == 6 and r.chunk_tokens_estimated and not r.tokens_estimated


def test_no_usage_estimates_from_text_and_flags_it() -> None:
    r = record([chunk(10, " hello world"), chunk(20, "!"), chunk(30, " again")])
    assert r.tokens_estimated
    assert r.tokens_per_chunk == [2, 1, 1]
    assert r.num_tokens == 4


def test_no_usage_with_a_tokenizer_counts_n_with_it() -> None:
    raw = RequestRecord(
        request_id=0,
        arm="a",
        prompt_id="p",
        category="c",
        scheduled_ns=0,
        send_ns=0,
        chunks=[chunk(10, " hello world"), chunk(20, "!"), chunk(30, " again")],
        output_text=" hello world! again",
    )
    r = derive(raw, count_tokens=lambda text: len(text))  # one "token" per character
    assert r.num_tokens == 19 and r.tokens_from_tokenizer and not r.tokens_estimated
    assert sum(r.tokens_per_chunk) == 19 and r.chunk_tokens_estimated
    # Reported usage wins over the tokenizer.
    raw.usage_completion_tokens = 5
    r = derive(raw, count_tokens=lambda text: len(text))
    assert r.num_tokens == 5 and not r.tokens_from_tokenizer


def test_no_token_chunk_gives_no_latencies() -> None:
    r = record([chunk(10, "", 0)], usage=0, error="boom")
    assert r.ttft_s is None and r.e2e_s is None and r.itl_s == []


def test_single_token_has_no_tpot() -> None:
    r = record([chunk(10, " a", 1)], usage=1)
    assert r.tpot_s is None and r.ttft_s == pytest.approx(0.010)


def test_distribution_percentiles_and_count() -> None:
    d = Distribution.of([float(x) for x in range(1, 101)])
    assert d.count == 100 and d.p50 == pytest.approx(50.5) and d.p99 == pytest.approx(99.01)
    assert Distribution.of([]).count == 0 and Distribution.of([]).p50 is None


def test_summarize_counts_errors_and_excludes_them_from_latency() -> None:
    good = record([chunk(10, " a", 1), chunk(30, " b c", 3)], usage=3)
    bad = record([chunk(5, " x", 1)], usage=1, error="HTTP 500")
    s = summarize([good, bad])
    assert s.num_requests == 2 and s.num_errors == 1 and s.error_rate == 0.5
    assert s.ttft_s.count == 1 and s.ttft_s.p50 == pytest.approx(0.010)
    # llmperf-compatible ITL: E2E / chunks (includes TTFT, one token per chunk)
    assert s.llmperf_itl_s.p50 == pytest.approx(0.030 / 2)
    assert s.itl_s.count == 2 and s.itl_s.p50 == pytest.approx(0.010)
