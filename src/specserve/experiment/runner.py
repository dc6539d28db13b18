"""Run the A/B experiment: start (or find) both arms, benchmark them alternately, report.

Each (load point, suite) pair is one A/B run, so the acceptance counters scraped around it
belong to that suite alone. A load point is a closed-loop concurrency (arms alternate every
``batch_size`` requests, ABBA) or an open-loop Poisson rate (each arm runs its requests as one
batch on the same arrival schedule, since arrivals cannot be interleaved request by request;
which arm goes first alternates from one rate to the next). Results are written as soon as
each run ends: a failure or Ctrl-C later keeps everything collected before it.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import yaml

from specserve.bench.compare import compare
from specserve.bench.inputs import (
    BenchConfig,
    ClosedLoop,
    LoadShape,
    SamplingConfig,
    WorkloadConfig,
)
from specserve.bench.results import BenchResult, save_result
from specserve.bench.runner import run_ab
from specserve.experiment.config import Endpoint, ExperimentConfig, ServersConfig
from specserve.experiment.headline import headline_markdown
from specserve.experiment.outcome import ALL_SUITES, ARMS, ExperimentOutcome, quality_summary
from specserve.experiment.report_page import index_html
from specserve.quality import ArmEndpoint, check_quality, run_quality, write_quality
from specserve.report.html import write_report
from specserve.server.launcher import ServerProcess

logger = logging.getLogger(__name__)


def default_output_dir(name: str, output_dir: str | None) -> Path:
    """``output_dir`` if given, else ``results/<name>-<UTC timestamp>`` (experiment, tune)."""
    if output_dir:
        return Path(output_dir)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path("results") / f"{name}-{stamp}"


def prefetch_models(servers: ServersConfig) -> None:
    """Fetch (or find cached) the models before any server starts, so a model that cannot be
    fetched fails fast with the loader's message instead of as a server that never gets ready."""
    from specserve.loading.catalog import CATALOG
    from specserve.loading.transport import fetch

    for name in (servers.target, servers.draft):
        if name is not None and name in CATALOG:  # paths and repo ids are the server's to load
            fetch(CATALOG[name])


@contextmanager
def started_servers(
    servers: ServersConfig, out: Path, on_status: Callable[[str], None]
) -> Iterator[tuple[dict[str, Endpoint], Callable[[], None]]]:
    """Start both arms' servers, wait for readiness, stop them (SIGTERM, then kill) on exit.

    Yields the endpoints and a check that raises :class:`ServerDiedError` if either server
    has exited since (called after every run, so a dead server stops the experiment).
    """
    ports = {"baseline": servers.baseline_port, "speculative": servers.speculative_port}
    with ExitStack() as stack:
        procs = {}
        for arm in ARMS:
            proc = ServerProcess(
                servers.serve_args(speculative=arm == "speculative"),
                log_path=out / "logs" / f"{arm}.log",
                name=arm,
                host=servers.host,
                port=ports[arm],
                ready_timeout_s=servers.startup_timeout_s,
            )
            stack.callback(proc.stop)
            proc.launch()  # both load at once; then wait for each
            procs[arm] = proc
        for arm, proc in procs.items():
            on_status(f"waiting for the {arm} server on {proc.base_url} (log: {proc.log_path})")
            proc.wait_ready()
        endpoints = {
            arm: Endpoint(base_url=p.base_url, model=served_model(p.base_url))
            for arm, p in procs.items()
        }

        def check_alive() -> None:
            for proc in procs.values():
                proc.check_alive()

        yield endpoints, check_alive


def served_model(base_url: str) -> str:
    """The first model id a server lists on ``/v1/models``."""
    resp = httpx.get(f"{base_url}/v1/models", timeout=10.0)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


def bench_configs(
    cfg: ExperimentConfig, endpoints: dict[str, Endpoint], load: LoadShape, suite: str
) -> list[BenchConfig]:
    b = cfg.benchmark
    return [
        BenchConfig(
            base_url=endpoints[arm].base_url,
            model=endpoints[arm].model,
            label=arm,
            endpoint=b.endpoint,
            workload=WorkloadConfig(suites=(suite,), llmperf=b.llmperf),
            sampling=SamplingConfig(
                max_tokens=b.max_tokens,
                min_tokens=b.min_tokens,
                ignore_eos=b.ignore_eos,
                temperature=b.temperature,
            ),
            load=load,
            num_requests=b.num_requests,
            warmup_requests=b.warmup_requests,
            metrics_url=endpoints[arm].metrics_url,
            timeout_s=b.timeout_s,
            progress=True,
        )
        for arm in ARMS
    ]


def run_experiment(
    cfg: ExperimentConfig, on_status: Callable[[str], None] = logger.info
) -> ExperimentOutcome:
    """Run the whole experiment; see the module docstring."""
    out = default_output_dir(cfg.name, cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    outcome = ExperimentOutcome(out, pricing=cfg.pricing())
    if cfg.quality is not None:
        check_quality(cfg.quality)  # a missing package fails here, before any server starts
    try:
        with ExitStack() as stack:
            if cfg.servers is not None:
                on_status("fetching models (cached after the first run)")
                prefetch_models(cfg.servers)
                endpoints, check_alive = stack.enter_context(
                    started_servers(cfg.servers, out, on_status)
                )
            else:
                assert cfg.endpoints is not None
                endpoints = {
                    "baseline": cfg.endpoints.baseline,
                    "speculative": cfg.endpoints.speculative,
                }

                def check_alive() -> None:
                    pass  # services we did not start are not ours to watch

            for index, (load_name, load) in enumerate(cfg.benchmark.load_points()):
                for suite in cfg.benchmark.suites:
                    on_status(f"benchmarking suite {suite!r} at load {load_name}")
                    results = _run_point(cfg, endpoints, load, suite, index)
                    run_dir = out / "runs" / load_name / Path(suite).stem
                    for r in results:
                        save_result(r, run_dir / r.label)
                    outcome.runs[(load_name, suite)] = results
                    comparison = compare(results, baseline="baseline", pricing=outcome.pricing)
                    outcome.comparisons[(load_name, suite)] = comparison
                    (run_dir / "comparison.json").write_text(comparison.model_dump_json(indent=1))
                    write_report(results, comparison, run_dir, outcome.pricing)
                    check_alive()  # a server that died during this run ends the experiment
            if cfg.quality is not None:
                on_status("quality check: the same tasks on both arms")
                arms = {
                    arm: ArmEndpoint(endpoints[arm].base_url, endpoints[arm].model) for arm in ARMS
                }
                outcome.quality_report = run_quality(cfg.quality, arms, on_status)
                outcome.quality[ALL_SUITES] = quality_summary(outcome.quality_report)
                write_quality(outcome.quality_report, out / "quality.json")
                check_alive()
    finally:
        if outcome.comparisons:  # keep the summary of every run that finished
            write_summary(outcome)
    return outcome


def _run_point(
    cfg: ExperimentConfig, endpoints: dict[str, Endpoint], load: LoadShape, suite: str, index: int
) -> list[BenchResult]:
    """Both arms at one load point, returned in ARMS order (see the module docstring)."""
    specs = bench_configs(cfg, endpoints, load, suite)
    if isinstance(load, ClosedLoop):
        return run_ab(specs, batch_size=cfg.benchmark.batch_size)
    order = specs if index % 2 == 0 else specs[::-1]
    results = run_ab(order, batch_size=cfg.benchmark.num_requests)
    return sorted(results, key=lambda r: ARMS.index(r.label))


def write_summary(outcome: ExperimentOutcome) -> None:
    """comparison.json (all runs), headline.md and report.html in the results folder."""
    all_rows = {
        f"{load}/{suite}": json.loads(cmp.model_dump_json())
        for (load, suite), cmp in outcome.comparisons.items()
    }
    (outcome.output_dir / "comparison.json").write_text(json.dumps(all_rows, indent=1))
    (outcome.output_dir / "headline.md").write_text(headline_markdown(outcome))
    (outcome.output_dir / "report.html").write_text(index_html(outcome), encoding="utf-8")
