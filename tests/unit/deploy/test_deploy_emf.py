"""Relaying the bench's CloudWatch EMF lines (namespace and dimensions added on the way)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specserve.deploy.emf import relay_lines


def _record(variant: str, ttft: float) -> dict[str, Any]:
    return {
        "_aws": {
            "Timestamp": 1_700_000_000_000,
            "CloudWatchMetrics": [
                {
                    "Namespace": "specserve/bench",
                    "Dimensions": [["Variant", "TestCase", "Concurrency"]],
                    "Metrics": [{"Name": "TTFT_p50", "Unit": "Seconds"}],
                }
            ],
        },
        "Variant": variant,
        "TestCase": "all",
        "Concurrency": "1",
        "TTFT_p50": ttft,
    }


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")


def test_relay_adds_dimensions_and_namespace(tmp_path: Path) -> None:
    _write(tmp_path / "run" / "emf.jsonl", [_record("baseline", 0.2), _record("candidate", 0.21)])
    lines = relay_lines(tmp_path, "Team/AB", {"Deployment": "demo", "Model": "Qwen/Qwen3-8B"})
    records = [json.loads(x) for x in lines]
    assert [r["Variant"] for r in records] == ["baseline", "candidate"]
    for r in records:
        directive = r["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == "Team/AB"
        assert directive["Dimensions"] == [
            ["Variant", "TestCase", "Concurrency", "Deployment", "Model"]
        ]
        assert (r["Deployment"], r["Model"]) == ("demo", "Qwen/Qwen3-8B")
    assert records[1]["TTFT_p50"] == 0.21


def test_relay_keeps_namespace_when_not_given(tmp_path: Path) -> None:
    _write(tmp_path / "emf.jsonl", [_record("baseline", 0.2)])
    (line,) = relay_lines(tmp_path / "emf.jsonl", None, {})
    assert json.loads(line) == _record("baseline", 0.2)


def test_relay_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        relay_lines(tmp_path / "missing", None, {})
    with pytest.raises(FileNotFoundError, match=r"no emf\.jsonl found"):
        relay_lines(tmp_path, None, {})
    _write(tmp_path / "emf.jsonl", [_record("baseline", 0.2)])
    (tmp_path / "emf.jsonl").write_text('{"Variant": "x"}\n')
    with pytest.raises(ValueError, match=r"emf\.jsonl:1: not an EMF record"):
        relay_lines(tmp_path, None, {})
    too_many = {f"D{i}": "v" for i in range(30)}
    _write(tmp_path / "emf.jsonl", [_record("baseline", 0.2)])
    with pytest.raises(ValueError, match="more than 30 dimensions"):
        relay_lines(tmp_path, None, too_many)
