"""Benchmark results: the run manifest, per-category summaries, records; saving and loading.

Files written for one result (one arm at one load point) under its directory:
    result.json     everything, records included (what ``specserve compare`` reads)
    summary.json    the same without the per-request records
    requests.jsonl  one request record per line (measured and warm-up, flagged)
"""

from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path

from pydantic import BaseModel, Field

from specserve import __version__
from specserve.bench.loadcheck import LoadCheck
from specserve.bench.metrics import CategorySummary
from specserve.bench.records import RequestRecord
from specserve.bench.scrape import Acceptance

ALL = "*"  # key of the all-categories summary


def machine_info() -> dict[str, str | int | None]:
    """Client machine description for the manifest."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }


class Manifest(BaseModel):
    """What was run, against what, from where."""

    spec: dict = Field(description="The BenchConfig (endpoint, model, sampling, load, workload).")
    server_models: dict | None = Field(default=None, description="GET /v1/models as reported.")
    server_info_error: str | None = None
    prompt_set_hash: str
    num_prompts: int
    client: str = Field(default=f"specserve-bench {__version__}", description="Client version.")
    machine: dict = Field(default_factory=machine_info)
    started_at: str = Field(description="UTC start time, ISO 8601.")
    t0_perf_counter_ns: int | None = Field(
        default=None, description="perf_counter_ns() at the run start; record times are after it."
    )


class BenchResult(BaseModel):
    """One arm at one load point."""

    label: str
    concurrency: int | None = None
    rate_rps: float | None = None
    manifest: Manifest
    load_check: LoadCheck
    window_s: float = Field(description="Σ over batches of first send → last finish.")
    output_throughput_tps: float = Field(description="Aggregate Σn / window (successful).")
    request_rate_rps: float = Field(description="Finished measured requests / window.")
    summary: dict[str, CategorySummary] = Field(description="Per category, plus '*' = all.")
    acceptance: Acceptance
    records: list[RequestRecord] = Field(default_factory=list)

    @property
    def load_name(self) -> str:
        return f"c{self.concurrency}" if self.concurrency is not None else f"r{self.rate_rps:g}"

    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]


def save_result(result: BenchResult, directory: str | Path) -> Path:
    """Write result.json, summary.json and requests.jsonl into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(result.model_dump_json(indent=1))
    (out / "summary.json").write_text(result.model_dump_json(indent=1, exclude={"records"}))
    with open(out / "requests.jsonl", "w") as f:
        for r in result.records:
            f.write(r.model_dump_json() + "\n")
    return out / "result.json"


def load_result(path: str | Path) -> BenchResult:
    """Read a result.json (or a directory holding one); ValueError with the reason if bad."""
    p = Path(path)
    if p.is_dir():
        p = p / "result.json"
    if not p.is_file():
        raise ValueError(f"no result file at {p}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from e
    if "records" not in data:
        raise ValueError(f"{p}: no per-request records; pass result.json, not summary.json")
    return BenchResult.model_validate(data)
