"""``specserve bench``: drive an OpenAI-compatible endpoint (or two, A/B) and report."""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from pydantic import ValidationError

from specserve.bench import (
    BenchConfig,
    BenchResult,
    ClosedLoop,
    LlmperfConfig,
    OpenLoop,
    SamplingConfig,
    WorkloadConfig,
    compare,
    run_ab,
    save_result,
)
from specserve.bench.pricing import Pricing
from specserve.bench.suites import suite_names
from specserve.commands.pricing_args import add_pricing_arguments, pricing_from_args
from specserve.report.html import write_report
from specserve.report.markdown import md_table
from specserve.report.tables import COST_HEADER, RUN_HEADER, cost_rows, run_rows


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="benchmark an OpenAI-compatible endpoint (or A/B two)", description=__doc__
    )
    target = p.add_argument_group("target")
    target.add_argument("--base-url", help="server root, e.g. http://127.0.0.1:8000")
    target.add_argument("--baseline", help="A/B: baseline server root")
    target.add_argument("--candidate", help="A/B: candidate server root")
    target.add_argument("--model", required=True, help="model name sent in requests")
    target.add_argument("--candidate-model", help="A/B: model name for the candidate")
    target.add_argument("--label", default="run", help="arm label of a single-endpoint run")
    target.add_argument("--endpoint", choices=["completions", "chat"], default="chat")
    target.add_argument("--metrics-url", help="Prometheus URL (default <root>/metrics; 'none')")
    target.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    target.add_argument(
        "--tokenizer",
        help="count output tokens with this model's tokenizer (catalog name, .gguf, HF dir or "
        "repo id) when a server sends no usage (default: estimate from the text)",
    )
    work = p.add_argument_group("workload")
    work.add_argument(
        "--suite",
        action="append",
        help=f"comma list of: {', '.join(suite_names())}, llmperf, FILE.jsonl; repeatable "
        "(default structured,open-ended)",
    )
    work.add_argument("--categories", help="comma list of categories to keep")
    work.add_argument("--llmperf-input-tokens", type=int, default=550)
    work.add_argument("--llmperf-input-stddev", type=int, default=150)
    work.add_argument("--llmperf-output-tokens", type=int, default=150)
    work.add_argument("--llmperf-lines-file", help="line file for llmperf mode")
    work.add_argument("--max-tokens", type=int, default=256)
    work.add_argument("--min-tokens", type=int)
    work.add_argument("--ignore-eos", action="store_true")
    work.add_argument("--temperature", type=float, default=0.0)
    load = p.add_argument_group("load")
    shape = load.add_mutually_exclusive_group()
    shape.add_argument("--concurrency", type=int, help="closed loop (default 1)")
    shape.add_argument("--rate", type=float, help="open loop, requests per second")
    shape.add_argument("--sweep-concurrency", type=_ints, help="e.g. 1,2,4,8")
    load.add_argument("--arrival", choices=["poisson", "constant"], default="poisson")
    load.add_argument("--seed", type=int, default=0, help="seed of arrivals and llmperf prompts")
    load.add_argument("--max-concurrency", type=int, help="open loop: cap on in-flight requests")
    bound = load.add_mutually_exclusive_group()
    bound.add_argument("--num-requests", type=int, help="measured requests per arm and load")
    bound.add_argument("--duration", type=float, help="seconds of measured load per arm")
    load.add_argument("--warmup", type=int, default=0, help="warm-up requests (excluded)")
    load.add_argument(
        "--ab-batch-size",
        type=int,
        help="A/B: measured requests per arm batch (default: 4 × concurrency)",
    )
    load.add_argument("--max-drift", type=float, default=0.05)
    add_pricing_arguments(p)
    p.add_argument("--output", help="output directory (default bench-results/<UTC time>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _arms(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(label, url, model) per arm; raises ValueError on an inconsistent choice."""
    if args.baseline or args.candidate:
        if not (args.baseline and args.candidate) or args.base_url:
            raise ValueError("A/B needs both --baseline and --candidate (and no --base-url)")
        return [
            ("baseline", args.baseline, args.model),
            ("candidate", args.candidate, args.candidate_model or args.model),
        ]
    if not args.base_url:
        raise ValueError("give --base-url, or --baseline and --candidate")
    return [(args.label, args.base_url, args.model)]


def build_bench_configs(args: argparse.Namespace) -> list[list[BenchConfig]]:
    """One list of arm specs per load point."""
    workload = WorkloadConfig(
        suites=tuple(
            s.strip()
            for arg in (args.suite or ["structured,open-ended"])
            for s in arg.split(",")
            if s.strip()
        ),
        categories=tuple(args.categories.split(",")) if args.categories else None,
        llmperf=LlmperfConfig(
            mean_input_tokens=args.llmperf_input_tokens,
            stddev_input_tokens=args.llmperf_input_stddev,
            mean_output_tokens=args.llmperf_output_tokens,
            seed=args.seed,
            lines_file=args.llmperf_lines_file,
        ),
    )
    sampling = SamplingConfig(
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
    )
    if args.rate is not None:
        loads: list[ClosedLoop | OpenLoop] = [
            OpenLoop(
                rate_rps=args.rate,
                arrival=args.arrival,
                seed=args.seed,
                max_concurrency=args.max_concurrency,
            )
        ]
    else:
        if args.max_concurrency is not None:
            raise ValueError("--max-concurrency applies to --rate (open loop) only")
        loads = [
            ClosedLoop(concurrency=c) for c in (args.sweep_concurrency or [args.concurrency or 1])
        ]
    num_requests = args.num_requests if args.duration is None else None
    if num_requests is None and args.duration is None:
        num_requests = 32
    return [
        [
            BenchConfig(
                base_url=url,
                model=model,
                label=label,
                endpoint=args.endpoint,
                workload=workload,
                sampling=sampling,
                load=load,
                num_requests=num_requests,
                duration_s=args.duration,
                warmup_requests=args.warmup,
                metrics_url=args.metrics_url,
                timeout_s=args.timeout,
                max_drift=args.max_drift,
                progress=not args.no_progress,
                tokenizer=args.tokenizer,
            )
            for label, url, model in _arms(args)
        ]
        for load in loads
    ]


def run(args: argparse.Namespace) -> int:
    try:
        pricing: Pricing | None = pricing_from_args(args)
        load_points = build_bench_configs(args)
    except (ValueError, ValidationError) as e:
        print(f"specserve bench: error: {e}", file=sys.stderr)
        return 2
    if args.tokenizer:  # load it before any request is sent: a bad name fails fast
        from specserve.bench.runner import token_counter

        try:
            token_counter(args.tokenizer)
        except (ValueError, OSError, RuntimeError) as e:  # the loaders' error families
            print(f"specserve bench: error: --tokenizer: {e}", file=sys.stderr)
            return 2
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.output or f"bench-results/{stamp}")
    results: list[BenchResult] = []
    for specs in load_points:
        load = specs[0].load
        batch = args.ab_batch_size or (4 * load.concurrency if isinstance(load, ClosedLoop) else 8)
        try:
            point = run_ab(specs, batch_size=batch if len(specs) > 1 else None)
        except ValueError as e:
            print(f"specserve bench: error: {e}", file=sys.stderr)
            return 2
        for r in point:
            save_result(r, out / f"{r.label}-{r.load_name}")
        results += point
    comparison = compare(results, pricing=pricing) if len(load_points[0]) > 1 else None
    if comparison is not None:
        (out / "comparison.json").write_text(comparison.model_dump_json(indent=1))
    paths = write_report(results, comparison, out, pricing)
    print(md_table(RUN_HEADER, run_rows(results)))
    print()
    print(md_table(COST_HEADER, cost_rows(results, comparison, pricing)))
    for r in results:
        if r.load_check.flagged:
            print(
                f"WARNING: {r.label}@{r.load_name}: achieved load {r.load_check.achieved:.3g} "
                f"drifts from target {r.load_check.target:.3g}",
                file=sys.stderr,
            )
        errors = r.summary["*"].num_errors
        if errors:
            first = next(x.error for x in r.measured() if x.error)
            print(
                f"WARNING: {r.label}@{r.load_name}: {errors} failed requests, e.g. {first}",
                file=sys.stderr,
            )
    if comparison is not None:
        for note in comparison.regressions:
            print(f"REGRESSION: {note}")
    print(f"results in {out}/ (report: {paths['html']})")
    return 0
