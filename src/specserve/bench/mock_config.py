"""Knobs of the mock OpenAI server (see mock_server.py for what each one does on the wire)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MockConfig:
    """Knobs of the mock server (all per server, applied to every request)."""

    ttft_ms: float = 20.0  # delay from request arrival to the first token chunk
    itl_ms: float = 5.0  # per-token inter-token latency; a chunk of k tokens waits k × itl_ms
    tokens_per_chunk: int = 1  # tokens carried by each content chunk (speculation-like when > 1)
    output_tokens: int = 32  # tokens generated (capped by the request's max_tokens)
    error_rate: float = 0.0  # fraction of requests answered with HTTP 500 before streaming
    seed: int = 0  # seed of the error draw
    empty_chunks: bool = False  # send an empty-content chunk before every content chunk
    split_frames: bool = False  # write each SSE event in three TCP writes, 1 ms apart
    ignore_stream_options: bool = False  # never send usage, whatever the client asks
    continuous_usage: bool = True  # honour continuous_usage_stats (else final usage only)
    fail_after_tokens: int | None = None  # send an error event after this many tokens
    abort_after_tokens: int | None = None  # drop the connection after this many tokens
    stall_after_tokens: int | None = None  # stop sending (hang) after this many tokens
    stamp_send_time: bool = False  # prefix each chunk's text with " @<perf_counter_ns>"
    spec_k: int = 0  # >0: expose vLLM spec-decode counters as if k tokens were drafted per step
    total_suffix: bool = True  # counters named ..._total (vLLM) or without the suffix
    model: str = "mock-model"
    reply: str | None = None  # a canned answer: every request gets this text (its words and
    # the whitespace after each are the tokens, capped by max_tokens) instead of token_text's

    def reply_tokens(self) -> list[str] | None:
        """The canned reply split into tokens that join back to it exactly (None: no reply)."""
        if self.reply is None:
            return None
        return re.findall(r"\S+\s*|\s+", self.reply) or [""]

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.itl_ms < 0:
            raise ValueError(f"delays must be >= 0, got ttft={self.ttft_ms} itl={self.itl_ms}")
        if self.tokens_per_chunk < 1 or self.output_tokens < 1:
            raise ValueError(
                f"tokens_per_chunk={self.tokens_per_chunk} and output_tokens="
                f"{self.output_tokens} must be >= 1"
            )
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {self.error_rate}")
        if self.spec_k < 0 or (self.spec_k > 0 and self.tokens_per_chunk > self.spec_k + 1):
            raise ValueError(f"tokens_per_chunk={self.tokens_per_chunk} > spec_k + 1")
