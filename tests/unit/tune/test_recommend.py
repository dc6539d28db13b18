"""Recommendation logic and the i.i.d. acceptance-length expectation."""

from __future__ import annotations

import pytest

from specserve.tune.recommend import SweepPoint, iid_expected_length, recommend


@pytest.mark.parametrize(
    ("alpha", "k", "expected"),
    [(0.0, 5, 1.0), (1.0, 7, 8.0), (0.5, 1, 1.5), (0.5, 3, 1.875), (0.8, 0, 1.0)],
)
def test_iid_expected_length(alpha: float, k: int, expected: float) -> None:
    assert iid_expected_length(alpha, k) == pytest.approx(expected)


def test_iid_expected_length_matches_sum_of_prefix_probabilities() -> None:
    for alpha in (0.1, 0.6, 0.95):
        for k in range(8):
            assert iid_expected_length(alpha, k) == pytest.approx(
                sum(alpha**i for i in range(k + 1))
            )


def test_iid_rejects_bad_alpha() -> None:
    with pytest.raises(ValueError, match="alpha"):
        iid_expected_length(1.5, 3)


def _p(k: int, speedup: float | None, category: str = "repeat") -> SweepPoint:
    return SweepPoint(
        proposer="draft",
        k=k,
        concurrency=1,
        category=category,
        tpot_speedup=speedup,
        ci_low=None,
        ci_high=None,
        acceptance_rate=None,
        mean_acceptance_length=None,
        iid_expected_length=None,
        num_requests=4,
    )


def test_recommends_smallest_k_within_tolerance() -> None:
    points = [_p(1, 1.5), _p(3, 2.40), _p(5, 2.50), _p(7, 2.45), _p(9, None)]
    (rec,) = recommend(points, tolerance=0.05)
    assert rec.best_k == 5 and rec.best_speedup == 2.5
    assert rec.recommended_k == 3  # 2.40 >= 2.5 * 0.95


def test_zero_tolerance_takes_the_best_and_groups_by_category() -> None:
    points = [_p(1, 1.1, "prose"), _p(3, 0.9, "prose"), _p(3, 2.0), _p(5, 1.9)]
    recs = {r.category: r for r in recommend(points, tolerance=0.0)}
    assert recs["prose"].recommended_k == 1
    assert recs["repeat"].recommended_k == 3
