"""BenchConfig validation: bad input gets a clear error."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from specserve.bench.inputs import BenchConfig, ClosedLoop, LoadShape, OpenLoop, SamplingConfig


def test_load_shape_discriminator() -> None:
    adapter: TypeAdapter = TypeAdapter(LoadShape)
    assert isinstance(adapter.validate_python({"kind": "rate", "rate_rps": 2}), OpenLoop)
    assert adapter.validate_python({"kind": "concurrency", "concurrency": 3}) == ClosedLoop(
        concurrency=3
    )
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "burst"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "num_requests or duration_s"),
        ({"num_requests": 1, "base_url": "localhost:8"}, "http"),
        ({"num_requests": 0}, "greater than or equal"),
        ({"num_requests": 1, "endpoint": "x"}, "chat"),
    ],
)
def test_bad_specs(kwargs: dict, match: str) -> None:
    base = {"base_url": "http://h:1", "model": "m"}
    with pytest.raises(ValidationError, match=match):
        BenchConfig(**(base | kwargs))


def test_min_tokens_above_max_refused() -> None:
    with pytest.raises(ValidationError, match="min_tokens"):
        SamplingConfig(max_tokens=5, min_tokens=6)


def test_urls() -> None:
    s = BenchConfig(base_url="http://h:1/v1/", model="m", num_requests=1)
    assert s.root_url == "http://h:1" and s.resolved_metrics_url == "http://h:1/metrics"
    assert s.model_copy(update={"metrics_url": "none"}).resolved_metrics_url is None
