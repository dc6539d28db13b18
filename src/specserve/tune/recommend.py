"""Turn sweep measurements into a recommendation.

Terms:
    α (acceptance rate): accepted draft tokens / drafted tokens, measured per k.
    τ (mean acceptance length): 1 + accepted / drafts — tokens per target step, bonus included.
    i.i.d. expectation: if every draft token were accepted independently with probability α,
        a k-token draft yields E[τ] = (1 − α^(k+1)) / (1 − α) (Leviathan et al., 2023, eq. 1).
        Measured τ below it means acceptance falls with position (drafts drift).
    recommended k: the smallest k whose TPOT speedup is within ``tolerance`` of the best k's,
        because a smaller k wastes less verification work when acceptance drops.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


def iid_expected_length(alpha: float, k: int) -> float:
    """E[τ] for a k-token draft with i.i.d. per-token acceptance ``alpha``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class SweepPoint(BaseModel):
    """One proposer at one k, load and category, against the plain baseline."""

    proposer: str
    k: int
    concurrency: int
    category: str
    tpot_speedup: float | None = Field(description="Median TPOT baseline / speculative.")
    ci_low: float | None
    ci_high: float | None
    acceptance_rate: float | None = Field(description="Per suite run (counter deltas).")
    mean_acceptance_length: float | None
    iid_expected_length: float | None = Field(description="(1 − α^(k+1))/(1 − α).")
    per_position: list[float] = Field(default_factory=list)
    num_requests: int


class Recommendation(BaseModel):
    proposer: str
    concurrency: int
    category: str
    best_k: int
    best_speedup: float
    recommended_k: int
    recommended_speedup: float


def recommend(points: list[SweepPoint], tolerance: float) -> list[Recommendation]:
    """Per (proposer, concurrency, category): the best k and the smallest k within tolerance."""
    groups: dict[tuple[str, int, str], list[SweepPoint]] = {}
    for p in points:
        if p.tpot_speedup is not None:
            groups.setdefault((p.proposer, p.concurrency, p.category), []).append(p)
    out = []
    for (proposer, conc, cat), pts in sorted(groups.items()):
        best = max(pts, key=lambda p: p.tpot_speedup or 0.0)
        assert best.tpot_speedup is not None
        floor = best.tpot_speedup * (1.0 - tolerance)
        chosen = min((p for p in pts if (p.tpot_speedup or 0.0) >= floor), key=lambda p: p.k)
        assert chosen.tpot_speedup is not None
        out.append(
            Recommendation(
                proposer=proposer,
                concurrency=conc,
                category=cat,
                best_k=best.k,
                best_speedup=best.tpot_speedup,
                recommended_k=chosen.k,
                recommended_speedup=chosen.tpot_speedup,
            )
        )
    return out
