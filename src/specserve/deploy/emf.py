"""CloudWatch embedded metric format (EMF) records from benchmark summaries.

A benchmark run writes one ``summary.json`` per arm (in sub-folders of its output folder).
Each numeric leaf of a summary becomes one metric named by its dotted path
(``ttft_s.p50``); the sub-folder becomes the ``Arm`` dimension. The records are printed as
one JSON object per line: CloudWatch Logs turns any log event carrying the ``_aws`` key into
metrics, so a Job's stdout shipped by Container Insights / Fluent Bit is enough.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_METRICS_PER_RECORD = 100  # EMF limit per metric directive
SUMMARY_FILE = "summary.json"


def flatten_numbers(obj: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of nested dicts as ``{"a.b": value}`` (bools and lists are skipped)."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            out.update(flatten_numbers(value, name))
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        out[prefix] = float(obj)
    return out


def unit_of(name: str) -> str:
    """EMF unit guessed from the metric's unit suffix (``_s``, ``_ms``, ...)."""
    leaf_parts = name.split(".")
    for part in reversed(leaf_parts):
        if part.endswith("_ms"):
            return "Milliseconds"
        if part.endswith("_s"):
            return "Seconds"
        if part.endswith(("_tps", "_tok_s")):
            return "Count/Second"
    return "None"


def find_summaries(root: Path) -> list[tuple[str, Path]]:
    """``(arm label, summary path)`` for every summary under ``root`` (sorted)."""
    if root.is_file():
        return [(root.parent.name, root)]
    found = sorted(root.rglob(SUMMARY_FILE))
    return [(str(p.parent.relative_to(root)).replace("/", ".") or "run", p) for p in found]


def emf_records(
    metrics: dict[str, float],
    namespace: str,
    dimensions: dict[str, str],
    timestamp_ms: int,
) -> Iterator[dict[str, Any]]:
    """EMF records carrying ``metrics``, at most 100 metrics each."""
    names = sorted(metrics)
    for start in range(0, len(names), MAX_METRICS_PER_RECORD):
        chunk = names[start : start + MAX_METRICS_PER_RECORD]
        yield {
            "_aws": {
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [
                    {
                        "Namespace": namespace,
                        "Dimensions": [sorted(dimensions)],
                        "Metrics": [{"Name": n, "Unit": unit_of(n)} for n in chunk],
                    }
                ],
            },
            **dimensions,
            **{n: metrics[n] for n in chunk},
        }


def emf_lines(
    root: str | Path, namespace: str, dimensions: dict[str, str], timestamp_ms: int
) -> list[str]:
    """All EMF lines for the summaries under ``root``.

    Raises:
        FileNotFoundError: ``root`` does not exist or holds no ``summary.json``.
        ValueError: a summary is not a JSON object.
    """
    path = Path(root)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    summaries = find_summaries(path)
    if not summaries:
        raise FileNotFoundError(f"{path}: no {SUMMARY_FILE} found")
    lines = []
    for arm, summary_path in summaries:
        data = json.loads(summary_path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{summary_path}: expected a JSON object")
        dims = {**dimensions, "Arm": arm}
        for record in emf_records(flatten_numbers(data), namespace, dims, timestamp_ms):
            lines.append(json.dumps(record, sort_keys=False))
    return lines
