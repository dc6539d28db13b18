"""Relay the benchmark's CloudWatch embedded metric format (EMF) lines to stdout.

``specserve bench`` writes ``emf.jsonl`` next to its report (``specserve.report.emf`` defines
the metrics: TTFT/TPOT/ITL/E2E percentiles, throughput, acceptance, per arm and test case).
In a Kubernetes Job nothing reads that file; printing the lines puts them in the pod log,
and CloudWatch Logs turns every log event that carries the ``_aws`` key into metrics (the
Container Insights / Fluent Bit agent ships the log). On the way, the namespace can be
replaced and deployment dimensions (e.g. ``Deployment=<name>``) added to every record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EMF_FILE = "emf.jsonl"
MAX_DIMENSIONS = 30  # CloudWatch limit per dimension set


def find_emf_files(root: Path) -> list[Path]:
    """``root`` itself if it is a file, else every ``emf.jsonl`` below it (sorted)."""
    if root.is_file():
        return [root]
    return sorted(root.rglob(EMF_FILE))


def relabel(record: dict[str, Any], namespace: str | None, dimensions: dict[str, str]) -> None:
    """Set the namespace and add ``dimensions`` to every dimension set of one record."""
    for directive in record["_aws"]["CloudWatchMetrics"]:
        if namespace is not None:
            directive["Namespace"] = namespace
        sets = directive.get("Dimensions") or [[]]
        directive["Dimensions"] = [[*s, *(d for d in dimensions if d not in s)] for s in sets]
        if any(len(s) > MAX_DIMENSIONS for s in directive["Dimensions"]):
            raise ValueError(f"more than {MAX_DIMENSIONS} dimensions in one set")
    record.update(dimensions)


def relay_lines(root: str | Path, namespace: str | None, dimensions: dict[str, str]) -> list[str]:
    """The EMF records under ``root``, relabelled, one JSON object per line.

    Raises:
        FileNotFoundError: ``root`` does not exist or holds no ``emf.jsonl``.
        ValueError: a line is not an EMF record (names the file and line).
    """
    path = Path(root)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    files = find_emf_files(path)
    if not files:
        raise FileNotFoundError(f"{path}: no {EMF_FILE} found")
    out = []
    for file in files:
        for lineno, line in enumerate(file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record["_aws"]["CloudWatchMetrics"], list):
                    raise TypeError
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{file}:{lineno}: not an EMF record") from e
            relabel(record, namespace, dimensions)
            out.append(json.dumps(record, sort_keys=True))
    return out
