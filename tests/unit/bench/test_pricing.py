"""Price per instance-hour: presets with their sources, given prices, energy, bad input."""

from __future__ import annotations

import re

import pytest

from specserve.bench.pricing import PRESETS, PricingError, resolve_pricing

REQUIRED = ("trn2.48xlarge", "trn1.32xlarge", "inf2.48xlarge", "g6e.xlarge", "p5.48xlarge")


def test_presets_carry_price_source_and_date() -> None:
    assert set(REQUIRED) | {"local"} <= set(PRESETS)
    for name in REQUIRED:
        p = PRESETS[name]
        assert p.usd_per_hour > 0, name
        assert p.source.startswith("https://"), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.read_on), name
        assert p.region.startswith("us-east-"), name
    assert PRESETS["local"].usd_per_hour == 0.0
    # the one preset not priced in us-east-1 says so
    assert (
        PRESETS["trn2.48xlarge"].region == "us-east-2"
        and "us-east-1" in PRESETS["trn2.48xlarge"].note
    )


def test_cost_per_million_tokens() -> None:
    p = resolve_pricing("trn1.32xlarge")
    assert p is not None and p.price_per_hour == 21.50 and p.instance == "trn1.32xlarge"
    assert p.usd_per_million(100.0) == pytest.approx(21.50 / 3600 / 100 * 1e6)
    assert p.usd_per_million(0.0) is None and p.usd_per_million(None) is None
    given = resolve_pricing(price_per_hour=3.6)
    assert given is not None and given.usd_per_million(1.0) == pytest.approx(1000.0)
    assert "given by the user" in given.describe()
    shared = resolve_pricing("trn1.32xlarge", instances_per_arm=0.5)
    assert shared is not None and shared.per_instance(10.0) == 20.0
    assert shared.usd_per_million(10.0) == pytest.approx(p.usd_per_million(20.0))
    assert "each arm uses 0.5 instance" in shared.describe()


def test_local_is_free_unless_energy_is_given() -> None:
    local = resolve_pricing("local")
    assert local is not None and local.hourly_usd == 0.0 and local.usd_per_million(10) == 0.0
    powered = resolve_pricing("local", watts=200, price_per_kwh=0.30)
    assert powered is not None and powered.hourly_usd == pytest.approx(0.06)
    energy_only = resolve_pricing(watts=200, price_per_kwh=0.30)
    assert energy_only is not None and energy_only.instance == "local"
    on_top = resolve_pricing(price_per_hour=1.0, watts=1000, price_per_kwh=0.5)
    assert on_top is not None and on_top.hourly_usd == pytest.approx(1.5)
    assert "energy 1000 W" in on_top.describe()
    assert resolve_pricing() is None


def test_bad_prices_are_refused_clearly() -> None:
    with pytest.raises(PricingError, match=r"unknown instance 'm7\.huge'; known: local, trn2"):
        resolve_pricing("m7.huge")
    with pytest.raises(PricingError, match="price per hour must be >= 0, got -1"):
        resolve_pricing(price_per_hour=-1)
    with pytest.raises(PricingError, match="watts must be >= 0"):
        resolve_pricing("local", watts=-5, price_per_kwh=0.1)
    with pytest.raises(PricingError, match="both watts and price per kWh"):
        resolve_pricing("local", watts=100)
    with pytest.raises(PricingError, match="instances per arm must be > 0, got 0"):
        resolve_pricing("local", instances_per_arm=0)
    with pytest.raises(PricingError, match="not both"):
        resolve_pricing("g6e.xlarge", price_per_hour=2.0)
