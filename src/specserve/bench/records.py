"""What the client records per request: raw timings, and the metrics derived from them.

All times are ``time.perf_counter_ns()`` values relative to the run's start (``t0``), in ns.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ChunkRecord(BaseModel):
    """One SSE event with a JSON payload, as received."""

    t_ns: int = Field(description="Arrival time (ns since run start) of the read completing it.")
    num_chars: int = Field(description="Characters of generated text in the chunk.")
    usage_completion_tokens: int | None = Field(
        default=None, description="Cumulative usage.completion_tokens when the chunk carried usage."
    )
    has_choice: bool = Field(description="Whether the chunk had a choice (vs usage-only).")
    text: str = Field(default="", description="Generated text of the chunk (for token estimates).")


class RequestRecord(BaseModel):
    """One request: identity, raw timeline, outcome, and derived metrics (filled later)."""

    request_id: int
    arm: str = Field(description="Arm label (baseline, candidate, run...).")
    concurrency: int | None = Field(
        default=None, description="Target concurrency of the load point."
    )
    rate_rps: float | None = Field(default=None, description="Target rate of the load point.")
    prompt_id: str
    category: str
    warmup: bool = False
    batch: int = Field(default=0, description="Batch index (A/B runs alternate arms by batch).")
    scheduled_ns: int = Field(description="When the load shape wanted the request sent.")
    send_ns: int = Field(description="When the request was handed to the HTTP client.")
    headers_ns: int | None = Field(default=None, description="When response headers arrived.")
    done_ns: int | None = Field(default=None, description="When the stream ended (or failed).")
    status: int | None = Field(default=None, description="HTTP status, None if no response.")
    error: str | None = Field(
        default=None, description="Error text; None when the request succeeded."
    )
    finish_reason: str | None = None
    max_tokens: int | None = Field(default=None, description="max_tokens sent.")
    chunks: list[ChunkRecord] = Field(default_factory=list)
    usage_completion_tokens: int | None = Field(
        default=None, description="Final reported n, if any."
    )
    output_text: str = ""
    output_sha256: str = ""
    # derived (see metrics.py and docs/metrics.md)
    num_tokens: int = 0
    tokens_estimated: bool = Field(
        default=False, description="n counted from text, not from usage."
    )
    chunk_tokens_estimated: bool = Field(default=False, description="Per-chunk tokens apportioned.")
    tokens_from_tokenizer: bool = Field(
        default=False, description="n counted with the run's tokenizer (the server sent no usage)."
    )
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    queue_s: float = 0.0
    icl_s: list[float] = Field(default_factory=list, description="Inter-chunk latencies.")
    itl_s: list[float] = Field(default_factory=list, description="Per-token ITL, one per token.")
    tokens_per_chunk: list[int] = Field(default_factory=list)
    token_times_s: list[float] = Field(
        default_factory=list, description="Time since send of each token chunk (cumulative)."
    )

    @property
    def ok(self) -> bool:
        return self.error is None
