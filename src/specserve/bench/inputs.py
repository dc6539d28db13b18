"""Benchmark inputs: what to send, to whom, and in which load shape (pydantic, boundary side).

Terms:
    closed loop: a fixed number of workers, each sends its next request when the previous one
        finished; the load is the *concurrency*.
    open loop: requests arrive on a schedule (constant spacing or a seeded Poisson process)
        whether or not earlier ones finished; the load is the *rate* in requests per second.
    warm-up: requests sent before the measured ones, under the same concurrency cap, and
        excluded from every statistic.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ClosedLoop(BaseModel):
    """Fixed concurrency: ``concurrency`` requests in flight at all times."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["concurrency"] = "concurrency"
    concurrency: int = Field(default=1, ge=1, le=10_000, description="Requests kept in flight.")


class OpenLoop(BaseModel):
    """Arrivals on a schedule, independent of completions."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["rate"] = "rate"
    rate_rps: float = Field(gt=0, le=100_000, description="Target arrival rate (requests/s).")
    arrival: Literal["constant", "poisson"] = Field(
        default="poisson",
        description="Inter-arrival gaps: constant 1/rate, or exponential (Poisson).",
    )
    seed: int = Field(default=0, description="Seed of the Poisson arrival process.")
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Optional cap on in-flight requests; waiting counts as queueing.",
    )


LoadShape = Annotated[ClosedLoop | OpenLoop, Field(discriminator="kind")]


class SamplingConfig(BaseModel):
    """Sampling parameters sent with every request."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_tokens: int = Field(default=256, ge=1, description="max_tokens of each request.")
    min_tokens: int | None = Field(
        default=None, ge=0, description="min_tokens (vLLM extension); sent only when set."
    )
    ignore_eos: bool = Field(
        default=False, description="ignore_eos (vLLM extension); sent only when set."
    )
    temperature: float = Field(default=0.0, ge=0.0, le=5.0, description="Sampling temperature.")
    seed: int | None = Field(
        default=None, description="Per-request sampling seed; sent only when set."
    )

    @model_validator(mode="after")
    def _check_lengths(self) -> SamplingConfig:
        if self.min_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} > max_tokens={self.max_tokens}")
        return self


class LlmperfConfig(BaseModel):
    """llmperf-compatible prompt construction (random lines up to an input-token target)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mean_input_tokens: int = Field(default=550, ge=10, description="Mean prompt length in tokens.")
    stddev_input_tokens: int = Field(default=150, ge=0, description="Std-dev of the prompt length.")
    mean_output_tokens: int = Field(
        default=150, ge=1, description="Output tokens asked for in the text."
    )
    num_prompts: int = Field(default=64, ge=1, description="Distinct prompts generated.")
    seed: int = Field(default=0, description="Seed of the line sampling.")
    lines_file: str | None = Field(
        default=None, description="Line file; default: the built-in one."
    )


class WorkloadConfig(BaseModel):
    """Which prompts: built-in suites, user JSONL files, or llmperf mode."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    suites: tuple[str, ...] = Field(
        default=("structured", "open-ended"),
        min_length=1,
        description="Built-in suite names, paths of JSONL prompt files, or 'llmperf'.",
    )
    categories: tuple[str, ...] | None = Field(
        default=None, description="Keep only these categories."
    )
    llmperf: LlmperfConfig = Field(default_factory=LlmperfConfig, description="llmperf mode knobs.")


class BenchConfig(BaseModel):
    """One benchmark run of one endpoint (an *arm*) at one load point."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    base_url: str = Field(description="Server root, e.g. http://127.0.0.1:8000 (with or w/o /v1).")
    model: str = Field(min_length=1, description="Model name sent in each request.")
    label: str = Field(
        default="run", min_length=1, description="Arm name, e.g. baseline / candidate."
    )
    endpoint: Literal["completions", "chat"] = Field(default="chat", description="API to call.")
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    load: LoadShape = Field(default_factory=ClosedLoop, description="Closed or open loop.")
    num_requests: int | None = Field(default=None, ge=1, description="Measured requests to send.")
    duration_s: float | None = Field(
        default=None, gt=0, description="Stop sending new requests after."
    )
    warmup_requests: int = Field(
        default=0, ge=0, description="Warm-up requests, excluded from results."
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra JSON fields merged into every request body (server-specific knobs, "
        "e.g. num_speculative_tokens); they override the fields the client sets.",
    )
    metrics_url: str | None = Field(
        default=None, description="Prometheus endpoint; default <root>/metrics; 'none' disables."
    )
    timeout_s: float = Field(default=600.0, gt=0, description="Per-request read/connect timeout.")
    max_drift: float = Field(default=0.05, ge=0, description="Flag when achieved load drifts more.")
    progress: bool = Field(default=False, description="Show a progress bar on stderr.")
    tokenizer: str | None = Field(
        default=None,
        description="Count output tokens with this tokenizer (catalog name, .gguf file, HF "
        "directory or repo id) when the server reports no usage; default: estimate from text.",
    )

    @model_validator(mode="after")
    def _check_bound(self) -> BenchConfig:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        return self

    @property
    def root_url(self) -> str:
        """Server root without a trailing ``/v1``."""
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @property
    def resolved_metrics_url(self) -> str | None:
        """Where to scrape Prometheus counters, or None when disabled."""
        if self.metrics_url == "none":
            return None
        return self.metrics_url or f"{self.root_url}/metrics"
