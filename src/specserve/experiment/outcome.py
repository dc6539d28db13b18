"""What an experiment produced: the arms' results and their comparisons per load point.

A leaf of ``experiment/``: the runner fills it in, the headline and report read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specserve.bench.compare import Comparison
from specserve.bench.results import BenchResult
from specserve.quality.results import QualityReport

ARMS = ("baseline", "speculative")


@dataclass
class ExperimentOutcome:
    """What an experiment produced (also on disk under ``output_dir``).

    Attributes:
        output_dir: the results folder.
        runs: (concurrency, suite) -> the two arms' results, in ARMS order.
        comparisons: (concurrency, suite) -> the baseline-vs-speculative comparison.
        quality: the task-accuracy check of both arms (quality.json); None when not run.
    """

    output_dir: Path
    runs: dict[tuple[int, str], list[BenchResult]] = field(default_factory=dict)
    comparisons: dict[tuple[int, str], Comparison] = field(default_factory=dict)
    quality: QualityReport | None = None
