"""The dashboard's queries name series that a live ``specserve serve`` really exposes.

Starts specserve's server (SmolLM2-135M as target and draft, fetched through the catalog),
sends a few requests so every histogram and counter has samples, scrapes ``/metrics`` and
checks each series and label used by the Grafana dashboard against the exposition.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specserve.deploy.dashboard import build_dashboard
from specserve.server.launcher import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
METRIC_TOKEN = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+")
SCRAPE_LABELS = {"arm", "le"}  # added by the scrape / present on every bucket


def _dashboard_series() -> set[str]:
    series: set[str] = set()
    for panel in build_dashboard()["panels"]:
        for target in panel.get("targets", []):
            series |= set(METRIC_TOKEN.findall(re.sub(r'"[^"]*"', '""', target["expr"])))
    return series


def _dashboard_labels() -> set[str]:
    labels: set[str] = set()
    for panel in build_dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            labels |= set(re.findall(r"([a-z_]+)\s*(?:=~|!=|=)\s*\"", expr))
            for group in re.findall(r"by \(([^)]*)\)", expr):
                labels |= {x.strip() for x in group.split(",")}
    return labels - SCRAPE_LABELS


@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """``sample name -> label names`` scraped from a live server after a few requests."""
    log_dir: Path = tmp_path_factory.mktemp("server")
    args = [
        "--model", MODEL, "--draft-model", MODEL, "--num-speculative-tokens", "2",
        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "2",
    ]  # fmt: skip
    with (
        ServerProcess(
            args, log_path=log_dir / "speculative.log", name="speculative", ready_timeout_s=600
        ) as server,
        httpx.Client(base_url=server.base_url, timeout=300) as client,
    ):
        for prompt in ("Count from 1 to 10.", "Name three colors."):
            r = client.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 16,
                    "temperature": 0,
                },
            )
            assert r.status_code == 200, r.text
        text = client.get("/metrics").text
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def test_every_dashboard_series_is_exposed(exposition: dict[str, set[str]]) -> None:
    missing = _dashboard_series() - set(exposition)
    assert not missing, f"dashboard queries series the server does not expose: {missing}"


def test_dashboard_labels_exist(exposition: dict[str, set[str]]) -> None:
    exposed = set().union(*exposition.values())
    missing = _dashboard_labels() - exposed
    assert not missing, f"dashboard groups or filters by labels never exposed: {missing}"
    for name in _dashboard_series():
        assert "model_name" in exposition[name], name
