"""``specserve tune`` configuration: which proposers, which k, which loads, which prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specserve.config import HEAD_METHODS, WeightFormat
from specserve.experiment.config import DEFAULT_DRAFT, DEFAULT_TARGET
from specserve.yaml_config import load_yaml_model


class TuneConfigError(ValueError):
    """The tune config is missing, unreadable or invalid (message lists every problem)."""


class ProposerConfig(BaseModel):
    """One proposer to sweep; each gets its own server (restarted only when this changes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$", description="Label in tables and plots.")
    method: Literal["draft", "ngram", "suffix", "hybrid", "eagle", "medusa"] = Field(
        description="Proposer kind."
    )
    draft: str | None = Field(
        default=None,
        description="Draft model (methods 'draft', 'hybrid') or trained head's directory or "
        "name (methods 'eagle', 'medusa'; `specserve train-draft`).",
    )
    draft_num_layers: int | None = Field(
        default=None,
        ge=1,
        description="Keep only the draft's first N layers: a cheaper, weaker draft.",
    )
    draft_weights: WeightFormat | None = Field(
        default=None, description="Weight format of the draft (default: the target's)."
    )

    @model_validator(mode="after")
    def _check(self) -> ProposerConfig:
        uses_draft = self.method in ("draft", "hybrid")
        uses_head = self.method in HEAD_METHODS
        if uses_draft and not self.draft:
            raise ValueError(f"proposer {self.name!r}: method {self.method!r} needs a draft model")
        if uses_head and not self.draft:
            raise ValueError(
                f"proposer {self.name!r}: method {self.method!r} needs a trained head (draft: "
                "its directory or name; `specserve train-draft` makes one)"
            )
        if not uses_draft and (self.draft_num_layers or self.draft_weights):
            raise ValueError(f"proposer {self.name!r}: draft settings need a draft method")
        if not (uses_draft or uses_head) and self.draft:
            raise ValueError(f"proposer {self.name!r}: method {self.method!r} takes no draft")
        return self

    def serve_args(self, k_max: int) -> list[str]:
        args = ["--spec-method", self.method, "--num-speculative-tokens", str(k_max)]
        if self.draft:
            args += ["--draft-model", self.draft]
        if self.draft_num_layers:
            args += ["--draft-num-layers", str(self.draft_num_layers)]
        if self.draft_weights:
            args += ["--draft-weights", self.draft_weights]
        return args


def _default_proposers() -> tuple[ProposerConfig, ...]:
    return (
        ProposerConfig(name="draft-0.5b", method="draft", draft=DEFAULT_DRAFT),
        ProposerConfig(
            name="draft-0.5b-int4", method="draft", draft=DEFAULT_DRAFT, draft_weights="int4"
        ),
        ProposerConfig(
            name="draft-0.5b-6L", method="draft", draft=DEFAULT_DRAFT, draft_num_layers=6
        ),
        ProposerConfig(name="ngram", method="ngram"),
        ProposerConfig(name="suffix", method="suffix"),
    )


class TuneConfig(BaseModel):
    """The sweep: proposers × k × concurrency × suites, each k against the plain baseline."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(default="tune", pattern=r"^[A-Za-z0-9._-]+$")
    output_dir: str | None = Field(default=None, description="Default results/<name>-<UTC>.")
    target: str = Field(default=DEFAULT_TARGET, description="Target model of every server.")
    dtype: Literal["float32", "bfloat16"] = Field(default="bfloat16")
    max_model_len: int = Field(default=2048, ge=64)
    max_num_seqs: int = Field(default=8, ge=1)
    extra_args: tuple[str, ...] = Field(default=(), description="Extra `specserve serve` args.")
    startup_timeout_s: float = Field(default=900.0, gt=0)
    proposers: tuple[ProposerConfig, ...] = Field(default_factory=_default_proposers, min_length=1)
    k: tuple[int, ...] = Field(default=(1, 2, 3, 5, 7), min_length=1, description="k values.")
    concurrency: tuple[int, ...] = Field(default=(1,), min_length=1)
    suites: tuple[str, ...] = Field(default=("structured", "open-ended"), min_length=1)
    endpoint: Literal["chat", "completions"] = "chat"
    num_requests: int = Field(default=4, ge=1, description="Measured requests per arm and cell.")
    warmup_requests: int = Field(default=1, ge=0)
    max_tokens: int = Field(default=64, ge=1)
    tolerance: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="Recommend the smallest k whose speedup is within this of the best.",
    )

    @model_validator(mode="after")
    def _check(self) -> TuneConfig:
        if any(not 1 <= k <= 32 for k in self.k):
            raise ValueError(f"every k must be in [1, 32], got {self.k}")
        if len(set(self.k)) != len(self.k):
            raise ValueError(f"k values repeat: {self.k}")
        if any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        names = [p.name for p in self.proposers]
        if len(set(names)) != len(names):
            raise ValueError(f"proposer names repeat: {names}")
        return self

    def base_serve_args(self) -> list[str]:
        return [
            "--model", self.target, "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
            *self.extra_args,
        ]  # fmt: skip


def load_tune_config(path: str | Path | None) -> TuneConfig:
    """Read and validate a YAML config; None gives the embedded default."""
    if path is None:
        return TuneConfig()
    return load_yaml_model(path, TuneConfig, TuneConfigError, "tune config")
