"""Acceptance counters with vLLM's definitions, so one scraper reads both servers.

Terms (per verification step of one request that had a non-empty draft):
    draft: one such step; ``num_drafts`` counts them.
    draft tokens: the tokens proposed in it; ``num_draft_tokens`` sums them.
    accepted tokens: the leading draft tokens the target kept (the recovered or bonus token
        the target adds on top is not counted); ``num_accepted_tokens`` sums them.
    per position: ``num_accepted_tokens_per_pos[i]`` counts drafts whose token at position i
        was accepted.

Derived:
    acceptance_rate = num_accepted_tokens / num_draft_tokens
    mean_acceptance_length = 1 + num_accepted_tokens / num_drafts (tokens per verify step,
        bonus included)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    """Running acceptance counters (see the module docstring for the definitions)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # How many drafts reached position i at all (had >= i + 1 draft tokens).
    num_drafted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one verification step; steps without draft tokens are not drafts."""
        if not (0 <= num_accepted <= num_draft_tokens):
            raise ValueError(
                f"need 0 <= num_accepted ({num_accepted}) <= num_draft_tokens ({num_draft_tokens})"
            )
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        self._grow(num_draft_tokens)
        for i in range(num_draft_tokens):
            self.num_drafted_tokens_per_pos[i] += 1
        for i in range(num_accepted):
            self.num_accepted_tokens_per_pos[i] += 1

    def _grow(self, n: int) -> None:
        for counts in (self.num_accepted_tokens_per_pos, self.num_drafted_tokens_per_pos):
            counts.extend([0] * (n - len(counts)))

    def merge(self, other: SpecDecodingStats) -> None:
        """Add another set of counters into this one."""
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self._grow(len(other.num_drafted_tokens_per_pos))
        for i, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[i] += n
        for i, n in enumerate(other.num_drafted_tokens_per_pos):
            self.num_drafted_tokens_per_pos[i] += n

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (0 when nothing was proposed)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts: tokens gained per verify step, the bonus token included."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def acceptance_rate_per_pos(self) -> list[float]:
        """Fraction of drafts accepted at each position, among drafts that reached it."""
        return [
            a / d if d else 0.0
            for a, d in zip(
                self.num_accepted_tokens_per_pos, self.num_drafted_tokens_per_pos, strict=True
            )
        ]

    def to_dict(self) -> dict[str, object]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
        }
