"""Wilson intervals and Newcombe's paired difference interval, against published values."""

from __future__ import annotations

import pytest

from specserve.quality.stats import PairedCounts, paired_difference_interval, wilson_interval


def test_wilson_matches_known_values() -> None:
    # 4 of 8: centre 0.5, symmetric; 0 of 8 and 8 of 8 mirror each other.
    assert wilson_interval(4, 8) == pytest.approx((0.2152, 0.7848), abs=1e-4)
    lo, hi = wilson_interval(0, 8)
    assert lo == 0.0 and hi == pytest.approx(0.3244, abs=1e-4)
    assert wilson_interval(8, 8) == pytest.approx((1 - hi, 1.0), abs=1e-12)
    # Newcombe (1998), single-proportion example 81/263: 0.2553 to 0.3662.
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    with pytest.raises(ValueError):
        wilson_interval(9, 8)


def test_paired_difference_matches_the_published_example() -> None:
    """Cavo et al. (2012) in Fagerland, Lydersen and Laake's paired 2x2 chapter: 59 both, 6
    only the first measurement, 16 only the second, 80 neither; the square-and-add interval
    of p(first) − p(second) is -0.0621 (-0.1186 to -0.0046)."""
    counts = PairedCounts(both=59, only_a=16, only_b=6, neither=80)  # b − a = first − second
    delta, lo, hi = paired_difference_interval(counts)
    assert delta == pytest.approx(-0.0621, abs=1e-4)
    assert (lo, hi) == pytest.approx((-0.1186, -0.0046), abs=1e-4)


def test_agreeing_arms_get_a_zero_delta_with_an_honest_width() -> None:
    delta, lo, hi = paired_difference_interval(
        PairedCounts.of([True] * 5 + [False] * 3, [True] * 5 + [False] * 3)
    )
    assert delta == 0.0 and lo < 0 < hi and lo == pytest.approx(-hi)
    delta, lo, hi = paired_difference_interval(PairedCounts.of([True] * 8, [True] * 8))
    assert delta == 0.0 and -1 < lo < 0 < hi < 1


def test_the_difference_is_second_minus_first_and_stays_in_range() -> None:
    a = [False] * 10
    b = [True] * 10
    delta, lo, hi = paired_difference_interval(PairedCounts.of(a, b))
    assert delta == 1.0 and 0 < lo < 1 and hi == 1.0
    delta, lo, hi = paired_difference_interval(PairedCounts.of(b, a))
    assert delta == -1.0 and lo == -1.0 and -1 < hi < 0


def test_paired_counts_need_equal_lengths() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        PairedCounts.of([True], [True, False])
    assert PairedCounts.of([True, True, False, False], [True, False, True, False]) == PairedCounts(
        1, 1, 1, 1
    )
