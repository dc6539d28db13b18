"""CloudWatch Embedded Metric Format (EMF) export: JSON lines, no AWS calls.

One line per result (arm × load point) and category, with dimensions Variant (arm label),
TestCase (category, ``all`` for every category) and Concurrency (or ``rate=<r>``), so the
lines can be shipped by any log agent and turn into CloudWatch metrics. With a price, the
``all`` line of each result carries CostPerMillionOutputTokens (USD) and PricePerHour; with a
comparison, each candidate's ``all`` line carries CostSaving and its CI bounds (fractions).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from specserve.bench.compare import Comparison
from specserve.bench.pricing import Pricing
from specserve.bench.results import ALL, BenchResult

NAMESPACE = "specserve/bench"


def emf_lines(
    results: Sequence[BenchResult],
    timestamp_ms: int,
    pricing: Pricing | None = None,
    comparison: Comparison | None = None,
) -> list[str]:
    savings = {(c.load, c.candidate): c for c in comparison.cost} if comparison else {}
    lines = []
    for r in results:
        for cat, s in r.summary.items():
            values: dict[str, tuple[float | None, str]] = {
                "TTFT_p50": (s.ttft_s.p50, "Seconds"),
                "TTFT_p90": (s.ttft_s.p90, "Seconds"),
                "TPOT_p50": (s.tpot_s.p50, "Seconds"),
                "TPOT_p90": (s.tpot_s.p90, "Seconds"),
                "ITL_p50": (s.itl_s.p50, "Seconds"),
                "ITL_p90": (s.itl_s.p90, "Seconds"),
                "E2E_p50": (s.e2e_s.p50, "Seconds"),
                "E2E_p90": (s.e2e_s.p90, "Seconds"),
                "TokensPerChunk_p50": (s.tokens_per_chunk.p50, "Count"),
                "Requests": (float(s.num_requests), "Count"),
                "Errors": (float(s.num_errors), "Count"),
            }
            if cat == ALL:
                values["OutputThroughput"] = (r.output_throughput_tps, "Count/Second")
                if r.acceptance.acceptance_rate is not None:
                    values["AcceptanceRate"] = (r.acceptance.acceptance_rate, "None")
                if r.acceptance.mean_acceptance_length is not None:
                    values["MeanAcceptanceLength"] = (r.acceptance.mean_acceptance_length, "None")
                if pricing is not None:
                    cost = pricing.usd_per_million(r.output_throughput_tps)
                    values["CostPerMillionOutputTokens"] = (cost, "None")
                    values["PricePerHour"] = (pricing.hourly_usd, "None")
                saved = savings.get((r.load_name, r.label))
                if saved is not None:
                    values["CostSaving"] = (saved.saving, "None")
                    values["CostSavingCILow"] = (saved.ci_low, "None")
                    values["CostSavingCIHigh"] = (saved.ci_high, "None")
            present = {k: v for k, v in values.items() if v[0] is not None}
            conc = str(r.concurrency) if r.concurrency is not None else f"rate={r.rate_rps:g}"
            doc: dict = {
                "_aws": {
                    "Timestamp": timestamp_ms,
                    "CloudWatchMetrics": [
                        {
                            "Namespace": NAMESPACE,
                            "Dimensions": [["Variant", "TestCase", "Concurrency"]],
                            "Metrics": [{"Name": k, "Unit": u} for k, (_, u) in present.items()],
                        }
                    ],
                },
                "Variant": r.label,
                "TestCase": "all" if cat == ALL else cat,
                "Concurrency": conc,
            }
            doc |= {k: v for k, (v, _) in present.items()}
            lines.append(json.dumps(doc, sort_keys=True))
    return lines


def write_emf(
    results: Sequence[BenchResult],
    path: str | Path,
    timestamp_ms: int,
    pricing: Pricing | None = None,
    comparison: Comparison | None = None,
) -> Path:
    p = Path(path)
    p.write_text("\n".join(emf_lines(results, timestamp_ms, pricing, comparison)) + "\n")
    return p
