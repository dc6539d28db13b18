"""Open-loop arrival schedules."""

from __future__ import annotations

import itertools

import pytest

from specserve.bench.arrivals import arrival_offsets_s
from specserve.bench.inputs import OpenLoop


def test_constant_spacing() -> None:
    offsets = list(arrival_offsets_s(OpenLoop(rate_rps=4, arrival="constant"), count=5))
    assert offsets == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])


def test_poisson_is_seeded_and_has_the_rate() -> None:
    load = OpenLoop(rate_rps=10, arrival="poisson", seed=3)
    a = list(arrival_offsets_s(load, count=20_000))
    assert a == list(arrival_offsets_s(load, count=20_000))
    assert a != list(arrival_offsets_s(load.model_copy(update={"seed": 4}), count=20_000))
    gaps = [y - x for x, y in itertools.pairwise(a)]
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(0.1, rel=0.03)  # 20k exponential gaps: sd of mean ≈ 0.7 %
    # exponential: the standard deviation equals the mean
    sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert sd == pytest.approx(mean, rel=0.05)


def test_duration_bound() -> None:
    offsets = list(arrival_offsets_s(OpenLoop(rate_rps=10, arrival="constant"), duration_s=1.0))
    assert len(offsets) == 10 and max(offsets) < 1.0


def test_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="count or duration"):
        next(arrival_offsets_s(OpenLoop(rate_rps=1)))
