"""What an experiment produced: the arms' results and their comparisons per load point.

A leaf of ``experiment/``: the runner fills it in, the headline and report read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specserve.bench.compare import Comparison
from specserve.bench.pricing import Pricing
from specserve.bench.results import BenchResult
from specserve.quality.results import QualityReport

ARMS = ("baseline", "speculative")
ALL_SUITES = "*"  # key of a quality entry that holds for every suite


@dataclass
class QualitySummary:
    """Task accuracy of both arms (filled by the quality check, issue #17 item 3).

    Attributes:
        task: what was scored, e.g. ``humaneval (subset of 20)``.
        baseline: score of the baseline arm (a fraction, e.g. pass@1).
        speculative: score of the speculative arm.
        ci_low, ci_high: 95 % CI of ``speculative − baseline`` (None when not computed).
        num_problems: problems scored per arm.
        note: anything a reader must know (e.g. "greedy; temperature 0").
    """

    task: str
    baseline: float
    speculative: float
    ci_low: float | None = None
    ci_high: float | None = None
    num_problems: int = 0
    note: str = ""

    @property
    def delta(self) -> float:
        return self.speculative - self.baseline


@dataclass
class ExperimentOutcome:
    """What an experiment produced (also on disk under ``output_dir``).

    Attributes:
        output_dir: the results folder.
        runs: (load, suite) -> the two arms' results, in ARMS order; load is ``c<N>``
            (closed loop, concurrency N) or ``r<R>`` (Poisson arrivals at R requests/s).
        comparisons: (load, suite) -> the baseline-vs-speculative comparison.
        pricing: the price per instance-hour the costs use (None: not priced).
        quality: suite (or ALL_SUITES) -> the arms' task accuracy; a suite without an entry
            is reported as "quality: not run". The runner fills ALL_SUITES from
            :attr:`quality_report` (see :func:`quality_summary`).
        quality_report: the whole quality check (quality.json); None when it did not run.
    """

    output_dir: Path
    runs: dict[tuple[str, str], list[BenchResult]] = field(default_factory=dict)
    comparisons: dict[tuple[str, str], Comparison] = field(default_factory=dict)
    pricing: Pricing | None = None
    quality: dict[str, QualitySummary] = field(default_factory=dict)
    quality_report: QualityReport | None = None

    def suites(self) -> list[str]:
        return list(dict.fromkeys(suite for _, suite in self.comparisons))

    def loads(self) -> list[str]:
        return list(dict.fromkeys(load for load, _ in self.comparisons))

    def quality_of(self, suite: str) -> QualitySummary | None:
        return self.quality.get(suite) or self.quality.get(ALL_SUITES)


def quality_summary(report: QualityReport) -> QualitySummary:
    """The verdict's view of a quality check: the task whose paired difference has the lowest
    upper CI bound (the most pessimistic; a drop on any task vetoes speculation), with the
    other tasks' lines in the note."""
    first, second = report.arm_names
    worst = min(report.tasks, key=lambda t: t.delta.ci95[1])
    others = [line for t, line in zip(report.tasks, report.lines(), strict=True) if t is not worst]
    return QualitySummary(
        task=worst.task,
        baseline=worst.arms[first].pass_at_1,
        speculative=worst.arms[second].pass_at_1,
        ci_low=worst.delta.ci95[0],
        ci_high=worst.delta.ci95[1],
        num_problems=len(worst.records),
        note="; ".join(others),
    )
