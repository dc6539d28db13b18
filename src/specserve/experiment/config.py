"""``specserve experiment`` configuration (pydantic, validated with clear errors).

An experiment is the reference study's A/B: two services identical except for speculation
(*baseline*: target only; *speculative*: target + proposer), benchmarked alternately with the
same prompts at temperature 0. Either specserve starts both servers itself (``servers``), or
the config points at two running endpoints (``endpoints``, e.g. two vLLM services), in which
case nothing is started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specserve.bench.inputs import ClosedLoop, LlmperfConfig, LoadShape, OpenLoop
from specserve.bench.pricing import Pricing, resolve_pricing
from specserve.config import HEAD_METHODS, WeightFormat
from specserve.quality.config import QualityConfig
from specserve.yaml_config import load_yaml_model

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


class ExperimentConfigError(ValueError):
    """The experiment config is missing, unreadable or invalid (message lists every problem)."""


_DTYPE_WEIGHTS: dict[str, WeightFormat] = {"float32": "fp32", "bfloat16": "bf16"}


class ServersConfig(BaseModel):
    """Two specserve servers started as subprocesses on free loopback ports."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    target: str = Field(default=DEFAULT_TARGET, description="Target model (catalog name/path).")
    draft: str | None = Field(
        default=None,
        description=f"Draft model for method 'draft' (same tokenizer; default {DEFAULT_DRAFT}), "
        "or the trained head's directory or name for methods 'eagle' and 'medusa'.",
    )
    method: Literal["draft", "ngram", "suffix", "hybrid", "eagle", "medusa"] = Field(
        default="draft",
        description="Proposer of the speculative server (draft: the draft model, as in the "
        "reference study; hybrid: suffix drafts where they get accepted, the draft model "
        "otherwise; eagle / medusa: a head trained with `specserve train-draft`).",
    )
    num_speculative_tokens: int | Literal["auto"] = Field(
        default="auto",
        description="Fixed k (the AWS study used 7) or 'auto' for the adaptive controller.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="bfloat16", description="Compute dtype of both servers."
    )
    weights: WeightFormat | None = Field(
        default=None,
        description="Weight format of both servers (default: the dtype's own float weights, "
        "as in the reference study's bf16 target; gguf: a quantised GGUF file's blocks).",
    )
    draft_weights: WeightFormat | None = Field(
        default="int4",
        description="Weight format of the draft only (int4: weight-only, an 8-10x cheaper step "
        "than the bf16 target's; the output stays the target's). None: same as the target.",
    )
    disable_by_batch_size: int | None = Field(
        default=3,
        ge=1,
        description="The speculative server stops drafting in steps with at least this many "
        "requests (on this CPU speculation lowered throughput at concurrency 4 and 8 "
        "without it, and at 4 with a limit of 4); None: never.",
    )
    max_model_len: int = Field(default=2048, ge=64, description="Context limit of both servers.")
    max_num_seqs: int = Field(default=8, ge=1, description="Batch limit of both servers.")
    host: str = Field(default="127.0.0.1", description="Loopback address the servers bind.")
    baseline_port: int | None = Field(default=None, ge=1, le=65535, description="None: free.")
    speculative_port: int | None = Field(default=None, ge=1, le=65535, description="None: free.")
    startup_timeout_s: float = Field(default=900.0, gt=0, description="Wait for readiness.")
    extra_args: tuple[str, ...] = Field(
        default=(), description="Extra `specserve serve` arguments for both servers."
    )

    @model_validator(mode="after")
    def _check(self) -> ServersConfig:
        k = self.num_speculative_tokens
        if isinstance(k, int) and not 1 <= k <= 32:
            raise ValueError(f"num_speculative_tokens must be in [1, 32] or 'auto', got {k}")
        uses_draft = self.method in ("draft", "hybrid")
        uses_head = self.method in HEAD_METHODS
        if uses_draft and self.draft is None:
            object.__setattr__(self, "draft", DEFAULT_DRAFT)
        if uses_head and self.draft is None:
            raise ValueError(
                f"method {self.method!r} needs draft: a trained head's directory or name "
                "(`specserve train-draft` makes one)"
            )
        if not (uses_draft or uses_head) and self.draft is not None:
            raise ValueError(
                "a draft model is only used with methods 'draft' and 'hybrid' (a head with "
                f"'eagle' and 'medusa'), not {self.method!r}"
            )
        if not uses_draft:
            if "draft_weights" in self.model_fields_set and self.draft_weights is not None:
                raise ValueError(
                    f"draft_weights is only used with methods 'draft' and 'hybrid', "
                    f"not {self.method!r}"
                )
            object.__setattr__(self, "draft_weights", None)  # the default means nothing here
        if self.baseline_port is not None and self.baseline_port == self.speculative_port:
            raise ValueError("baseline_port and speculative_port must differ")
        if not self.host.startswith("127.") and self.host not in ("localhost", "::1"):
            raise ValueError(f"servers bind loopback addresses only, got {self.host!r}")
        return self

    def serve_args(self, speculative: bool) -> list[str]:
        """`specserve serve` arguments of one arm (the arms differ only in speculation)."""
        args = ["--model", self.target, "--dtype", self.dtype]
        args += [
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
        ]
        # Explicit, because `specserve serve` alone would pick gguf for a quantised GGUF file.
        args += ["--weights", self.weights or _DTYPE_WEIGHTS[self.dtype]]
        if speculative:
            args += ["--spec-method", self.method]
            if self.draft is not None:
                args += ["--draft-model", self.draft]
            if self.draft_weights is not None:
                args += ["--draft-weights", self.draft_weights]
            if self.disable_by_batch_size is not None:
                args += ["--speculative-disable-by-batch-size", str(self.disable_by_batch_size)]
            args += ["--num-speculative-tokens", str(self.num_speculative_tokens)]
        else:
            args += ["--spec-method", "none"]
        return args + list(self.extra_args)


class Endpoint(BaseModel):
    """A running OpenAI-compatible service."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    base_url: str = Field(description="Root URL, e.g. http://vllm-baseline:8000")
    model: str = Field(min_length=1, description="Model name the service serves.")
    metrics_url: str | None = Field(default=None, description="Default: <base_url>/metrics.")


class EndpointsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    baseline: Endpoint
    speculative: Endpoint


class BenchmarkConfig(BaseModel):
    """How both arms are driven (identically)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    suites: tuple[str, ...] = Field(
        default=("structured", "open-ended"),
        min_length=1,
        description="Built-in suites, JSONL prompt files or 'llmperf'.",
    )
    llmperf: LlmperfConfig = Field(
        default_factory=LlmperfConfig,
        description="Prompt construction of the 'llmperf' suite (input/output token targets).",
    )
    endpoint: Literal["chat", "completions"] = Field(default="chat", description="API used.")
    concurrency: tuple[int, ...] = Field(
        default=(1,),
        description="Closed-loop concurrency levels (each a run); default [1] unless rates "
        "are given.",
    )
    rates: tuple[float, ...] = Field(
        default=(),
        description="Open-loop request rates (requests/s, seeded Poisson arrivals), each a run: "
        "the throughput-latency sweep.",
    )
    arrival_seed: int = Field(default=0, description="Seed of the Poisson arrivals of rates.")
    num_requests: int = Field(default=8, ge=1, description="Measured requests per arm and level.")
    warmup_requests: int = Field(default=1, ge=0, description="Per arm, excluded from results.")
    batch_size: int = Field(
        default=1, ge=1, description="Arms alternate every batch_size requests (ABBA order)."
    )
    max_tokens: int = Field(default=64, ge=1, description="max_tokens of every request.")
    min_tokens: int | None = Field(default=None, ge=0, description="min_tokens, when set.")
    ignore_eos: bool = Field(default=False, description="Fixed output lengths when true.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="0 = greedy (study).")
    timeout_s: float = Field(default=600.0, gt=0, description="Per-request timeout.")

    @model_validator(mode="after")
    def _check(self) -> BenchmarkConfig:
        if self.rates and "concurrency" not in self.model_fields_set:
            object.__setattr__(self, "concurrency", ())  # a rate sweep alone
        if any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if any(not 0 < r <= 100_000 for r in self.rates):
            raise ValueError(f"rates must be in (0, 100000] requests/s, got {self.rates}")
        if not self.concurrency and not self.rates:
            raise ValueError("give at least one load point (concurrency or rates)")
        if len(set(self.concurrency)) < len(self.concurrency) or len(set(self.rates)) < len(
            self.rates
        ):
            raise ValueError("concurrency levels and rates must not repeat")
        return self

    def load_points(self) -> list[tuple[str, LoadShape]]:
        """(name, load) of every run, lowest load first: c<N> closed loops, then r<R> rates."""
        points: list[tuple[str, LoadShape]] = [
            (f"c{c}", ClosedLoop(concurrency=c)) for c in sorted(self.concurrency)
        ]
        points += [
            (f"r{r:g}", OpenLoop(rate_rps=r, arrival="poisson", seed=self.arrival_seed))
            for r in sorted(self.rates)
        ]
        return points


class CostConfig(BaseModel):
    """Price of one instance-hour (each arm runs on one instance) for $/1M output tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    instance: str | None = Field(
        default=None, description="Preset: local, trn2.48xlarge, trn1.32xlarge, ... (docs)."
    )
    price_per_hour: float | None = Field(default=None, description="USD per instance-hour.")
    watts: float | None = Field(default=None, description="Average power draw (energy).")
    price_per_kwh: float | None = Field(default=None, description="USD per kWh (energy).")
    instances_per_arm: float = Field(
        default=1.0, description="Instances one arm occupies (0.5: both arms share one)."
    )

    @model_validator(mode="after")
    def _check(self) -> CostConfig:
        if self.instance is None and self.price_per_hour is None and self.watts is None:
            raise ValueError("cost: give instance or price_per_hour")
        self.pricing()  # unknown preset, negative price: refused here, with the reason
        return self

    def pricing(self) -> Pricing:
        pricing = resolve_pricing(
            self.instance,
            self.price_per_hour,
            self.watts,
            self.price_per_kwh,
            self.instances_per_arm,
        )
        assert pricing is not None
        return pricing


class ExperimentConfig(BaseModel):
    """The whole experiment. With no file, every default below is the embedded study."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(default="default", pattern=r"^[A-Za-z0-9._-]+$", description="Run name.")
    output_dir: str | None = Field(
        default=None, description="Results folder; default results/<name>-<UTC timestamp>."
    )
    servers: ServersConfig | None = Field(default=None, description="Start two servers of ours.")
    endpoints: EndpointsConfig | None = Field(default=None, description="Or use running services.")
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)
    quality: QualityConfig | None = Field(
        default_factory=QualityConfig,
        description="Task-accuracy check of both arms after the benchmark (HumanEval subset "
        "and generated exact-answer questions); null: none.",
    )
    cost: CostConfig | None = Field(
        default=None,
        description="Price per instance-hour; default: 'local' (0) when we start the servers, "
        "none for endpoints (the saving is reported either way).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ExperimentConfig:
        if self.servers is not None and self.endpoints is not None:
            raise ValueError("give either 'servers' (start ours) or 'endpoints', not both")
        if self.servers is None and self.endpoints is None:
            object.__setattr__(self, "servers", ServersConfig())
        limit = self.servers.disable_by_batch_size if self.servers is not None else None
        if self.quality is not None and limit is not None and self.quality.concurrency >= limit:
            raise ValueError(
                f"quality.concurrency ({self.quality.concurrency}) must be below "
                f"servers.disable_by_batch_size ({limit}): at that batch size the speculative "
                "server stops drafting, so the quality check would not test speculation"
            )
        return self

    def pricing(self) -> Pricing | None:
        """The price of one arm's instance-hour, or None (endpoints without a cost block)."""
        if self.cost is not None:
            return self.cost.pricing()
        return resolve_pricing("local") if self.servers is not None else None


def load_config(path: str | Path | None) -> ExperimentConfig:
    """Read and validate a YAML config; None gives the embedded default."""
    if path is None:
        return ExperimentConfig()
    return load_yaml_model(path, ExperimentConfig, ExperimentConfigError, "experiment config")
