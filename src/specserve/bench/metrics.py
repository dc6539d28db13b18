"""Latency and throughput metrics from recorded chunk timelines (definitions: docs/metrics.md).

Per request, with t = chunk arrival time − send time:
    token chunk: a chunk that carries at least one output token.
    n: usage.completion_tokens when reported, else max_tokens when the server finished with
        ``finish_reason: "length"``, else the output text's length in tokens of the run's
        tokenizer when one is given (``tokens_from_tokenizer``), else Σ chunk tokens
        (``tokens_estimated``).
    TTFT = t(first token chunk);  E2E = t(last token chunk);  TPOT = (E2E − TTFT) / (n − 1).
    ICL (inter-chunk latency) = gaps between consecutive token chunks.
    per-token ITL = each gap / tokens in the chunk ending it, repeated once per token, so the
        distribution is token-weighted; a chunk of k tokens contributes k equal entries.
    TPC (tokens per chunk) = tokens carried by each token chunk.
Tokens per chunk come, in order of preference, from the deltas of the cumulative
``usage.completion_tokens`` (continuous usage stats), else from the known n (final usage, or
max_tokens on a ``length`` finish) apportioned over the chunks by text length
(``chunk_tokens_estimated``), else from the text
(:func:`estimate_tokens`, ``tokens_estimated``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, Field

from specserve.bench.records import ChunkRecord, RequestRecord
from specserve.bench.workloads import estimate_tokens

PERCENTILES = (50, 90, 95, 99)


def chunk_token_counts(
    chunks: Sequence[ChunkRecord], total: int | None = None
) -> tuple[list[int], bool, bool]:
    """Tokens carried by each chunk, and flags (chunk counts apportioned, counts estimated).

    ``total`` is a known n to apportion when the chunks carry no usage at all.
    """
    # chunks without text (e.g. the chat role chunk) need not carry usage
    continuous = [c.usage_completion_tokens for c in chunks if c.num_chars > 0]
    if continuous and all(u is not None for u in continuous):
        counts, prev = [], 0
        for c in chunks:
            u = c.usage_completion_tokens
            counts.append(max(0, u - prev) if u is not None else 0)
            prev = max(prev, u) if u is not None else prev
        return counts, False, False
    final = next(
        (
            c.usage_completion_tokens
            for c in reversed(chunks)
            if c.usage_completion_tokens is not None
        ),
        None,
    )
    final = total if final is None else final
    chars = [c.num_chars if c.has_choice else 0 for c in chunks]
    if final is not None and sum(chars) > 0:
        return _apportion(final, chars), True, False
    return [max(1, estimate_tokens(c.text)) if c.num_chars else 0 for c in chunks], True, True


def _apportion(total: int, weights: list[int]) -> list[int]:
    """Split ``total`` over chunks proportionally to ``weights`` (largest remainder),
    giving each non-empty chunk at least one token when there are enough tokens."""
    nonzero = [i for i, w in enumerate(weights) if w > 0]
    counts = [0] * len(weights)
    base = 1 if total >= len(nonzero) else 0
    for i in nonzero:
        counts[i] = base
    rest = total - base * len(nonzero)
    wsum = sum(weights)
    shares = [(rest * weights[i] / wsum, i) for i in nonzero]
    for share, i in shares:
        counts[i] += math.floor(share)
    left = total - sum(counts)
    for _, i in sorted(((s - math.floor(s), i) for s, i in shares), reverse=True)[:left]:
        counts[i] += 1
    return counts


def derive(
    record: RequestRecord, count_tokens: Callable[[str], int] | None = None
) -> RequestRecord:
    """Fill the derived fields of ``record`` from its raw chunks (in place; returns it).

    ``count_tokens`` (text -> tokens, e.g. the served model's tokenizer) counts n when the
    server reported no usage, instead of estimating it from words.
    """
    record.queue_s = max(0, record.send_ns - record.scheduled_ns) / 1e9
    known = record.usage_completion_tokens
    if known is None and record.finish_reason == "length" and record.max_tokens and record.ok:
        known = record.max_tokens  # the server said it stopped at max_tokens
    record.tokens_from_tokenizer = False
    if known is None and count_tokens is not None and record.ok and record.output_text:
        known = count_tokens(record.output_text)
        record.tokens_from_tokenizer = True
    counts, apportioned, estimated = chunk_token_counts(record.chunks, known)
    token_chunks = [(c.t_ns, k) for c, k in zip(record.chunks, counts, strict=True) if k > 0]
    record.chunk_tokens_estimated = apportioned
    record.tokens_estimated = estimated
    record.num_tokens = known if known is not None else sum(k for _, k in token_chunks)
    record.tokens_per_chunk = [k for _, k in token_chunks]
    record.token_times_s = [(t - record.send_ns) / 1e9 for t, _ in token_chunks]
    if not token_chunks:
        record.ttft_s = record.e2e_s = record.tpot_s = None
        record.icl_s, record.itl_s = [], []
        return record
    record.ttft_s = record.token_times_s[0]
    record.e2e_s = record.token_times_s[-1]
    n = record.num_tokens
    record.tpot_s = (record.e2e_s - record.ttft_s) / (n - 1) if n > 1 else None
    times = record.token_times_s
    record.icl_s = [b - a for a, b in itertools.pairwise(times)]
    record.itl_s = [
        gap / k
        for gap, (_, k) in zip(record.icl_s, token_chunks[1:], strict=True)
        for _ in range(k)
    ]
    return record


class Distribution(BaseModel):
    """Summary of a sample: count, mean and percentiles (linear interpolation)."""

    count: int = Field(description="Sample count.")
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if len(values) == 0:
            return cls(count=0)
        arr = np.asarray(values, dtype=np.float64)
        p = np.percentile(arr, PERCENTILES)
        return cls(
            count=len(arr),
            mean=float(arr.mean()),
            p50=float(p[0]),
            p90=float(p[1]),
            p95=float(p[2]),
            p99=float(p[3]),
            min=float(arr.min()),
            max=float(arr.max()),
        )


class CategorySummary(BaseModel):
    """Statistics over the successful measured requests of one category (or all: ``*``)."""

    num_requests: int
    num_errors: int
    error_rate: float
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution = Field(description="Per-token ITL, pooled over tokens.")
    icl_s: Distribution = Field(description="Inter-chunk latency, pooled over gaps.")
    e2e_s: Distribution
    tokens_per_chunk: Distribution
    output_tokens: Distribution
    request_throughput_tps: Distribution = Field(description="Per request n / E2E.")
    queue_s: Distribution
    llmperf_itl_s: Distribution = Field(
        description="llmperf-compatible ITL: E2E / chunks (includes TTFT, 1 token per chunk)."
    )
    tokens_estimated: int = Field(description="Requests whose n was estimated from text.")
    tokens_from_tokenizer: int = Field(
        default=0, description="Requests whose n was counted with the run's tokenizer."
    )


def summarize(records: Sequence[RequestRecord]) -> CategorySummary:
    ok = [r for r in records if r.ok and r.ttft_s is not None]
    errors = [r for r in records if not r.ok]
    return CategorySummary(
        num_requests=len(records),
        num_errors=len(errors),
        error_rate=len(errors) / len(records) if records else 0.0,
        ttft_s=Distribution.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=Distribution.of([r.tpot_s for r in ok if r.tpot_s is not None]),
        itl_s=Distribution.of([x for r in ok for x in r.itl_s]),
        icl_s=Distribution.of([x for r in ok for x in r.icl_s]),
        e2e_s=Distribution.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        tokens_per_chunk=Distribution.of([x for r in ok for x in r.tokens_per_chunk]),
        output_tokens=Distribution.of([r.num_tokens for r in ok]),
        request_throughput_tps=Distribution.of(
            [r.num_tokens / r.e2e_s for r in ok if r.e2e_s and r.e2e_s > 0]
        ),
        queue_s=Distribution.of([r.queue_s for r in records]),
        llmperf_itl_s=Distribution.of(
            [r.e2e_s / len(r.tokens_per_chunk) for r in ok if r.e2e_s and r.tokens_per_chunk]
        ),
        tokens_estimated=sum(r.tokens_estimated for r in ok),
        tokens_from_tokenizer=sum(r.tokens_from_tokenizer for r in ok),
    )
