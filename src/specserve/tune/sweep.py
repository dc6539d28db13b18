"""Run the tune sweep: one plain baseline server for the whole sweep, one speculative server
per proposer (restarted only when the proposer/draft changes), k varied per request.

Within a (proposer, concurrency, suite) cell all arms — the baseline and one arm per k — run
alternately from one client, so every speedup is a side-by-side ratio. Because arms never
overlap, the /metrics deltas scraped around each arm's batches belong to that arm's k.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specserve.bench.compare import Comparison, compare
from specserve.bench.inputs import BenchConfig, ClosedLoop, SamplingConfig, WorkloadConfig
from specserve.bench.results import BenchResult, save_result
from specserve.bench.runner import run_ab
from specserve.experiment.runner import default_output_dir, served_model
from specserve.server.launcher import ServerProcess
from specserve.tune.config import ProposerConfig, TuneConfig
from specserve.tune.recommend import Recommendation, SweepPoint, iid_expected_length, recommend
from specserve.tune.report import write_tune_report


@dataclass
class TuneOutcome:
    output_dir: Path
    points: list[SweepPoint] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    results: list[BenchResult] = field(default_factory=list)


def _arm_label(proposer: ProposerConfig, k: int) -> str:
    return f"{proposer.name}-k{k}"


def _specs(
    cfg: TuneConfig,
    base: tuple[str, str],
    spec: tuple[str, str],
    proposer: ProposerConfig,
    concurrency: int,
    suite: str,
) -> list[BenchConfig]:
    common = dict(
        endpoint=cfg.endpoint,
        workload=WorkloadConfig(suites=(suite,)),
        sampling=SamplingConfig(max_tokens=cfg.max_tokens, temperature=0.0),
        load=ClosedLoop(concurrency=concurrency),
        num_requests=cfg.num_requests,
        warmup_requests=cfg.warmup_requests,
        progress=True,
    )
    arms = [BenchConfig(base_url=base[0], model=base[1], label="baseline", **common)]  # type: ignore[arg-type]
    for k in cfg.k:
        arms.append(
            BenchConfig(
                base_url=spec[0],
                model=spec[1],
                label=_arm_label(proposer, k),
                extra_body={"num_speculative_tokens": k},
                **common,  # type: ignore[arg-type]
            )
        )
    return arms


def points_from(
    cfg: TuneConfig, proposer: ProposerConfig, concurrency: int, comparison: Comparison
) -> list[SweepPoint]:
    load = f"c{concurrency}"
    points = []
    for row in comparison.rows:
        k = int(row.candidate.rsplit("-k", 1)[1])
        tpot = next(m for m in row.metrics if m.metric == "tpot_s")
        acc = comparison.acceptance.get(load, {}).get(row.candidate)
        alpha = acc.acceptance_rate if acc else None
        points.append(
            SweepPoint(
                proposer=proposer.name,
                k=k,
                concurrency=concurrency,
                category=row.category,
                tpot_speedup=tpot.speedup,
                ci_low=tpot.ci_low,
                ci_high=tpot.ci_high,
                acceptance_rate=alpha,
                mean_acceptance_length=acc.mean_acceptance_length if acc else None,
                iid_expected_length=iid_expected_length(alpha, k) if alpha is not None else None,
                per_position=acc.per_position if acc else [],
                num_requests=row.num_requests_candidate,
            )
        )
    return points


def run_tune(cfg: TuneConfig, on_status: Callable[[str], None]) -> TuneOutcome:
    out = default_output_dir(cfg.name, cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    outcome = TuneOutcome(out)
    k_max = max(cfg.k)
    with ExitStack() as stack:
        baseline = ServerProcess(
            [*cfg.base_serve_args(), "--spec-method", "none"],
            log_path=out / "logs" / "baseline.log",
            name="baseline",
            ready_timeout_s=cfg.startup_timeout_s,
        )
        stack.callback(baseline.stop)
        baseline.start()
        base = (baseline.base_url, served_model(baseline.base_url))
        for proposer in cfg.proposers:
            on_status(f"starting the speculative server for proposer {proposer.name!r}")
            with ServerProcess(
                [*cfg.base_serve_args(), *proposer.serve_args(k_max)],
                log_path=out / "logs" / f"{proposer.name}.log",
                name=proposer.name,
                ready_timeout_s=cfg.startup_timeout_s,
            ) as server:
                spec = (server.base_url, served_model(server.base_url))
                for conc in cfg.concurrency:
                    for suite in cfg.suites:
                        on_status(
                            f"{proposer.name}: suite {suite!r}, concurrency {conc}, k={cfg.k}"
                        )
                        results = run_ab(
                            _specs(cfg, base, spec, proposer, conc, suite), batch_size=1
                        )
                        cell = out / "runs" / proposer.name / f"c{conc}" / Path(suite).stem
                        for r in results:
                            save_result(r, cell / r.label)
                        comparison = compare(results, baseline="baseline")
                        (cell / "comparison.json").write_text(comparison.model_dump_json(indent=1))
                        outcome.results += results
                        outcome.points += points_from(cfg, proposer, conc, comparison)
                        _write(outcome, cfg)
                server.check_alive()
        baseline.check_alive()
    return outcome


def _write(outcome: TuneOutcome, cfg: TuneConfig) -> None:
    outcome.recommendations = recommend(outcome.points, cfg.tolerance)
    data = {
        "points": [p.model_dump() for p in outcome.points],
        "recommendations": [r.model_dump() for r in outcome.recommendations],
    }
    (outcome.output_dir / "tune.json").write_text(json.dumps(data, indent=1))
    write_tune_report(outcome.points, outcome.recommendations, outcome.output_dir)
