"""The Grafana dashboard: valid dashboard JSON, and every query names a contract metric."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from specserve.deploy.dashboard import build_dashboard
from specserve.deploy.render import dashboard_json
from tests.unit.deploy.deploy_helpers import REPO

# The server's Prometheus metric contract (kind per name; exposition adds _total to counters).
CONTRACT: dict[str, str] = {
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "specserve:spec_off_steps": "counter",
    "specserve:num_preemptions": "counter",
    "specserve:requests_rejected": "counter",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "specserve:draft_time_seconds": "histogram",
    "specserve:verify_time_seconds": "histogram",
    "specserve:spec_k_chosen": "histogram",
}
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
# Labels the contract defines, plus those the scrape adds (arm from the pod label, le).
KNOWN_LABELS = {"model_name", "position", "finished_reason", "reason", "arm", "le"}

# Every series name a query may use: name + the suffix its kind gets in the exposition.
ALLOWED = {name + sfx for name, kind in CONTRACT.items() for sfx in SUFFIXES[kind]}
METRIC_TOKEN = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (all contract names contain a colon)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(METRIC_TOKEN.findall(without_strings))


def _panels() -> list[dict[str, Any]]:
    return [p for p in build_dashboard()["panels"] if p["type"] != "row"]


def _exprs() -> list[str]:
    return [t["expr"] for p in _panels() for t in p["targets"]]


def test_dashboard_structure() -> None:
    dash = build_dashboard()
    assert dash["uid"] == "specserve-ab" and dash["title"]
    assert isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        assert panel["type"] in ("timeseries", "stat")
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0


def test_dashboard_covers_the_ab_views() -> None:
    exprs = "\n".join(_exprs())
    for q in ("0.5", "0.9", "0.99"):
        assert f"histogram_quantile({q}, sum by (le, arm)" in exprs
    for metric in (
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:generation_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    ):
        assert metric in exprs
    titles = {p["title"] for p in _panels()}
    assert {"Acceptance rate", "Mean acceptance length"} <= titles


def test_every_query_names_contract_metrics() -> None:
    for expr in _exprs():
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        unknown = names - ALLOWED
        assert not unknown, f"not in the metric contract: {unknown} in {expr!r}"


def test_every_query_uses_known_labels() -> None:
    for expr in _exprs():
        labels = set(re.findall(r"([a-z_]+)\s*(?:=~|!=|=)\s*\"", expr))
        labels |= {x.strip() for g in re.findall(r"by \(([^)]*)\)", expr) for x in g.split(",")}
        labels |= set(re.findall(r"ignoring\(([a-z_]+)\)", expr))
        assert labels <= KNOWN_LABELS, (labels - KNOWN_LABELS, expr)


@pytest.mark.parametrize(
    ("expr", "bad"),
    [
        ("rate(vllm:spec_decode_num_drafts[1m])", "vllm:spec_decode_num_drafts"),
        ("vllm:time_to_first_token_seconds_total", "vllm:time_to_first_token_seconds_total"),
        ("rate(vllm:num_preemptions_total[1m])", "vllm:num_preemptions_total"),
    ],
)
def test_contract_check_catches_wrong_names(expr: str, bad: str) -> None:
    assert bad in metric_names(expr) - ALLOWED


def test_checked_in_dashboard_is_current() -> None:
    path = REPO / "deploy" / "grafana" / "specserve-ab.json"
    assert json.loads(path.read_text()) == json.loads(dashboard_json()), (
        "deploy/grafana/specserve-ab.json is stale: run "
        "`specserve deploy dashboard -o deploy/grafana/specserve-ab.json`"
    )
