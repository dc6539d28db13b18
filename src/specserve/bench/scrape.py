"""Prometheus scraping and speculative-decoding statistics from counter deltas.

Counters (vLLM's names, read with or without the ``_total`` suffix, summed over label sets
other than ``position``):
    drafts            vllm:spec_decode_num_drafts           verification steps with a draft
    draft_tokens      vllm:spec_decode_num_draft_tokens     tokens proposed
    accepted_tokens   vllm:spec_decode_num_accepted_tokens  proposed tokens accepted
    accepted_per_pos  vllm:spec_decode_num_accepted_tokens_per_pos{position=i}
Over a run (after − before): acceptance rate α = Δaccepted / Δdraft_tokens; mean acceptance
length τ = 1 + Δaccepted / Δdrafts (the 1 is the bonus token); per-position acceptance
α_i = Δaccepted_per_pos[i] / Δdrafts.
"""

from __future__ import annotations

import re
from collections import defaultdict

from pydantic import BaseModel, Field

_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_prometheus(text: str) -> Samples:
    """Parse Prometheus text exposition into {(name, sorted labels): value}.

    Raises ValueError on a line that is neither a comment nor a sample.
    """
    samples: Samples = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"line {lineno}: not a Prometheus sample: {line[:120]!r}")
        labels = tuple(sorted(_LABEL.findall(m.group("labels") or "")))
        value = float(m.group("value"))  # accepts NaN, +Inf
        samples[(m.group("name"), labels)] = value
    return samples


class SpecCounters(BaseModel):
    """Spec-decode counter values at one instant (or a difference of two)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = Field(default_factory=dict)
    present: bool = Field(default=False, description="Whether any spec-decode counter was exposed.")

    @classmethod
    def from_samples(cls, samples: Samples) -> SpecCounters:
        totals: dict[str, float] = defaultdict(float)
        per_pos: dict[int, float] = defaultdict(float)
        present = False
        for (name, labels), value in samples.items():
            base = name.removesuffix("_total").removeprefix("vllm:spec_decode_num_")
            if not name.startswith("vllm:spec_decode_num_"):
                continue
            present = True
            if base == "accepted_tokens_per_pos":
                pos = dict(labels).get("position")
                if pos is not None:
                    per_pos[int(pos)] += value
            elif base in ("drafts", "draft_tokens", "accepted_tokens"):
                totals[base] += value
        return cls(accepted_per_pos=dict(per_pos), present=present, **totals)

    def minus(self, before: SpecCounters) -> SpecCounters:
        positions = set(self.accepted_per_pos) | set(before.accepted_per_pos)
        return SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_pos={
                p: self.accepted_per_pos.get(p, 0.0) - before.accepted_per_pos.get(p, 0.0)
                for p in sorted(positions)
            },
            present=self.present or before.present,
        )

    def plus(self, other: SpecCounters) -> SpecCounters:
        neg = SpecCounters(
            drafts=-other.drafts,
            draft_tokens=-other.draft_tokens,
            accepted_tokens=-other.accepted_tokens,
            accepted_per_pos={p: -v for p, v in other.accepted_per_pos.items()},
            present=other.present,
        )
        return self.minus(neg)


class Acceptance(BaseModel):
    """Acceptance statistics over a run, from counter deltas (None when not measurable)."""

    available: bool = Field(description="Whether the server exposed spec-decode counters.")
    note: str = Field(default="", description="Why unavailable, when it is.")
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    acceptance_rate: float | None = Field(default=None, description="Δaccepted / Δdraft_tokens.")
    mean_acceptance_length: float | None = Field(
        default=None, description="1 + Δaccepted / Δdrafts."
    )
    per_position: list[float] = Field(
        default_factory=list, description="Δaccepted_per_pos[i] / Δdrafts."
    )

    @classmethod
    def from_delta(cls, delta: SpecCounters) -> Acceptance:
        if not delta.present:
            return cls(available=False, note="no vllm:spec_decode_* counters on /metrics")
        drafts, tokens = delta.drafts, delta.draft_tokens
        return cls(
            available=True,
            num_drafts=drafts,
            num_draft_tokens=tokens,
            num_accepted_tokens=delta.accepted_tokens,
            acceptance_rate=delta.accepted_tokens / tokens if tokens > 0 else None,
            mean_acceptance_length=1 + delta.accepted_tokens / drafts if drafts > 0 else None,
            per_position=[
                delta.accepted_per_pos[p] / drafts if drafts > 0 else 0.0
                for p in sorted(delta.accepted_per_pos)
            ],
        )
