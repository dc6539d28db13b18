"""The answer to "turn speculative decoding on or not", per suite, from an experiment.

Per load point (speculative vs baseline, 95 % bootstrap CIs):
    faster: the TPOT speedup's CI lies above 1; slower: below 1; else no clear difference.
    cheaper: the cost saving's CI lies above 0; dearer: below 0; else no clear difference.
Per suite:
    off   if the quality check ran and its delta's CI lies below 0 (quality drops), or the
          speculative arm is slower or dearer at every load point;
    on    if it is faster and not dearer at every load point;
    depends  if it is so at the lowest load points and slower or dearer above them;
    unclear  otherwise (CIs that include "no change": measure more requests).
A suite whose quality was not checked says so next to its decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.bench.compare import CategoryComparison, MetricComparison
from specserve.bench.cost import CostComparison
from specserve.bench.results import ALL
from specserve.experiment.outcome import ARMS, ExperimentOutcome, QualitySummary
from specserve.report.sweep import Crossover, SweepPoint, crossover

DECISIONS = {
    "on": "Turn it ON",
    "off": "Leave it OFF",
    "depends": "ON at low load only",
    "unclear": "No clear answer",
}


def _side(low: float | None, high: float | None, level: float) -> bool | None:
    """True: the CI lies above ``level``; False: below; None: it includes it (or no CI).
    A missing bound is unbounded (an infinite ratio in the bootstrap resamples)."""
    if low is not None and low > level:
        return True
    if high is not None and high < level:
        return False
    return None


@dataclass(frozen=True)
class LoadVerdict:
    """The speculative arm against the baseline at one load point (all categories)."""

    load: str
    tpot: MetricComparison | None
    cost: CostComparison | None
    acceptance_rate: float | None
    acceptance_length: float | None
    exact_match: float | None

    @property
    def faster(self) -> bool | None:
        """True: TPOT CI above 1; False: below 1; None: no clear difference."""
        t = self.tpot
        if t is None:
            return None
        return _side(t.ci_low, t.ci_high, 1.0)

    @property
    def cheaper(self) -> bool | None:
        """True: saving CI above 0; False: below 0; None: no clear difference."""
        c = self.cost
        if c is None:
            return None
        return _side(c.ci_low, c.ci_high, 0.0)

    @property
    def good(self) -> bool:
        return self.faster is True and self.cheaper is not False

    @property
    def bad(self) -> bool:
        return self.faster is False or self.cheaper is False


@dataclass(frozen=True)
class SuiteVerdict:
    suite: str
    decision: str  # a key of DECISIONS
    reason: str
    loads: list[LoadVerdict]
    quality: QualitySummary | None
    crossover: Crossover

    @property
    def headline(self) -> str:
        return DECISIONS[self.decision]


def _all_row(rows: list[CategoryComparison]) -> CategoryComparison | None:
    return next((r for r in rows if r.category == ALL), None)


def load_verdicts(outcome: ExperimentOutcome, suite: str) -> list[LoadVerdict]:
    verdicts = []
    for (load, s), cmp in outcome.comparisons.items():
        if s != suite:
            continue
        row = _all_row(cmp.rows)
        acc = cmp.acceptance.get(load, {}).get(ARMS[1])
        verdicts.append(
            LoadVerdict(
                load=load,
                tpot=next((m for m in row.metrics if m.metric == "tpot_s"), None) if row else None,
                cost=next((c for c in cmp.cost if c.load == load), None),
                acceptance_rate=acc.acceptance_rate if acc and acc.available else None,
                acceptance_length=acc.mean_acceptance_length if acc and acc.available else None,
                exact_match=row.exact_match_rate if row else None,
            )
        )
    return verdicts


def sweep_points(outcome: ExperimentOutcome, suite: str) -> list[SweepPoint]:
    return [
        SweepPoint(load, results[0], results[1])
        for (load, s), results in outcome.runs.items()
        if s == suite and len(results) == 2
    ]


def decide(loads: list[LoadVerdict], quality: QualitySummary | None) -> tuple[str, str]:
    """(decision, reason) by the rules of the module docstring."""
    if quality is not None and quality.ci_high is not None and quality.ci_high < 0:
        return "off", f"quality drops on {quality.task} ({quality.delta:+.1%})"
    if not loads:
        return "unclear", "no load point finished"
    if all(v.good for v in loads):
        return "on", "faster (TPOT CI > 1) and not dearer at every load point"
    if all(v.bad for v in loads):
        return "off", "slower or dearer at every load point"
    lead = next((i for i, v in enumerate(loads) if not v.good), len(loads))
    rest = loads[lead:]
    if lead > 0 and any(v.bad for v in rest) and not any(v.good for v in rest):
        return "depends", f"faster up to {loads[lead - 1].load}; not from {rest[0].load}"
    unclear = [v.load for v in loads if not v.good and not v.bad]
    return "unclear", (
        f"no clear difference at {', '.join(unclear)} (CIs include 1): measure more requests"
        if unclear
        else "faster at some load points, slower at others"
    )


def suite_verdicts(outcome: ExperimentOutcome) -> list[SuiteVerdict]:
    verdicts = []
    for suite in outcome.suites():
        loads = load_verdicts(outcome, suite)
        quality = outcome.quality_of(suite)
        decision, reason = decide(loads, quality)
        verdicts.append(
            SuiteVerdict(
                suite, decision, reason, loads, quality, crossover(sweep_points(outcome, suite))
            )
        )
    return verdicts


def quality_text(quality: QualitySummary | None) -> str:
    if quality is None:
        return "not run"
    ci = (
        ""
        if quality.ci_low is None or quality.ci_high is None
        else f" [{quality.ci_low:+.1%}, {quality.ci_high:+.1%}]"
    )
    text = (
        f"{quality.task}: baseline {quality.baseline:.1%}, speculative {quality.speculative:.1%}"
        f", Δ {quality.delta:+.1%}{ci}"
    )
    if quality.num_problems:
        text += f", n={quality.num_problems}"
    return text + (f" ({quality.note})" if quality.note else "")
