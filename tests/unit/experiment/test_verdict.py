"""The verdict per suite: on, off, depends on load, or unclear; quality can veto."""

from __future__ import annotations

from specserve.bench.compare import MetricComparison
from specserve.bench.cost import CostComparison
from specserve.experiment.outcome import QualitySummary
from specserve.experiment.verdict import LoadVerdict, decide, quality_text


def lv(
    load: str, tpot: tuple[float, float, float], cost: tuple[float, float, float]
) -> LoadVerdict:
    t = MetricComparison(
        metric="tpot_s",
        baseline_p50=0.2,
        baseline_p90=0.3,
        candidate_p50=0.1,
        candidate_p90=0.2,
        speedup=tpot[0],
        ci_low=tpot[1],
        ci_high=tpot[2],
        n_baseline=8,
        n_candidate=8,
        regression=False,
    )
    c = CostComparison(
        load=load,
        baseline="baseline",
        candidate="speculative",
        baseline_tps=10.0,
        candidate_tps=15.0,
        price_per_hour=1.0,
        baseline_usd_per_mtok=27.8,
        candidate_usd_per_mtok=18.5,
        saving=cost[0],
        ci_low=cost[1],
        ci_high=cost[2],
        num_requests_baseline=8,
        num_requests_candidate=8,
    )
    return LoadVerdict(load, t, c, 0.7, 3.1, 1.0)


FAST, SLOW, SAME = (2.0, 1.5, 2.5), (0.8, 0.7, 0.9), (1.0, 0.9, 1.1)
CHEAP, DEAR, EVEN = (0.3, 0.2, 0.4), (-0.2, -0.3, -0.1), (0.0, -0.1, 0.1)


def test_on_off_depends_unclear() -> None:
    assert decide([lv("c1", FAST, CHEAP), lv("c2", FAST, EVEN)], None)[0] == "on"
    assert decide([lv("c1", SLOW, EVEN), lv("c2", SAME, DEAR)], None)[0] == "off"
    decision, reason = decide(
        [lv("c1", FAST, CHEAP), lv("c2", FAST, CHEAP), lv("c4", SAME, DEAR), lv("c8", SLOW, DEAR)],
        None,
    )
    assert decision == "depends" and reason == "faster up to c2; not from c4"
    decision, reason = decide([lv("c1", FAST, CHEAP), lv("c2", SAME, EVEN)], None)
    assert decision == "unclear" and "no clear difference at c2" in reason
    assert decide([lv("c1", SLOW, DEAR), lv("c2", FAST, CHEAP)], None)[0] == "unclear"
    assert decide([lv("c1", FAST, DEAR)], None)[0] == "off"  # faster but dearer
    assert decide([], None)[0] == "unclear"


def test_quality_drop_vetoes_and_absence_is_reported() -> None:
    worse = QualitySummary("humaneval", 0.50, 0.40, -0.18, -0.02, 40)
    decision, reason = decide([lv("c1", FAST, CHEAP)], worse)
    assert decision == "off" and "quality drops on humaneval" in reason
    kept = QualitySummary("humaneval", 0.50, 0.50, -0.08, 0.08, 40, "greedy")
    assert decide([lv("c1", FAST, CHEAP)], kept)[0] == "on"
    assert quality_text(None) == "not run"
    text = quality_text(kept)
    assert "baseline 50.0%, speculative 50.0%, Δ +0.0% [-8.0%, +8.0%], n=40 (greedy)" in text


def test_an_unbounded_ci_is_shown_not_crashed_on() -> None:
    from specserve.experiment.headline import _speedup
    from specserve.experiment.report_page import _card
    from specserve.experiment.verdict import SuiteVerdict
    from specserve.report.sweep import Crossover

    v = lv("c1", (3.0, 2.5, 3.5), CHEAP)
    assert v.tpot is not None
    unbounded = v.tpot.model_copy(update={"ci_high": None})  # an infinite ratio in the resamples
    assert _speedup(unbounded) == "3.00× [2.50, –]"
    load = LoadVerdict("c1", unbounded, v.cost, None, None, None)
    assert load.faster is True  # the CI lies above 1, unbounded above
    card = _card(SuiteVerdict("s", "on", "r", [load], None, Crossover("none")), True)
    assert "3.00× [2.50, –]" in card and "not run" in card
