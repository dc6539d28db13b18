"""Speculative vs baseline ``specserve serve``, side by side in one run, through HTTP.

Starts two servers on loopback (same target; the candidate adds the draft model), then drives
both with ``specserve bench`` (A/B batches alternating between the arms) on the structured and
the open-ended prompt suites at several concurrencies, and prints per suite and concurrency:
median TPOT of each arm, the TPOT speedup (ratio of medians, bootstrap 95 % CI), aggregate
output throughput of each arm and its ratio, acceptance, and the exact-match rate of the texts.

Heavy (loads the Qwen pair twice): run it alone, e.g.

    .venv/bin/python benchmarks/serve_ab.py

Results (JSON per arm and load, comparison.json, HTML report) go to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from specserve.config import WEIGHT_FORMATS
from specserve.server.launcher import ServerProcess

ALL = "*"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument(
        "--draft-weights",
        default="int4",
        choices=WEIGHT_FORMATS,
        help="the draft's weight format (the target stays --dtype)",
    )
    p.add_argument("--num-speculative-tokens", default="auto", help="k or 'auto'")
    p.add_argument(
        "--disable-by-batch-size",
        type=int,
        default=3,
        help="the speculative server drafts only in steps with fewer requests (0: always)",
    )
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--concurrency", default="1,2,4,8", help="comma list")
    p.add_argument("--suites", default="structured,open-ended", help="comma list")
    p.add_argument("--num-requests", type=int, default=8, help="measured requests per arm/load")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--output", default="bench-results/serve_ab")
    return p.parse_args(argv)


def run_suite(args: argparse.Namespace, base: str, cand: str, suite: str, out: Path) -> None:
    cmd = [
        sys.executable, "-m", "specserve.cli", "bench",
        "--baseline", base, "--candidate", cand, "--model", args.model,
        "--endpoint", "chat", "--suite", suite,
        "--sweep-concurrency", args.concurrency,
        "--num-requests", str(args.num_requests), "--max-tokens", str(args.max_tokens),
        "--temperature", "0", "--output", str(out), "--no-progress",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def fmt(x: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "—" if x is None else f"{x * scale:.{digits}f}"


def summarize(suite: str, comparison: dict[str, Any]) -> list[str]:
    rows = []
    for row in comparison["rows"]:
        if row["category"] != ALL:
            continue
        load = row["load"]
        tpot = next(m for m in row["metrics"] if m["metric"] == "tpot_s")
        tput = comparison["throughput"].get(load, {})
        base_tps, cand_tps = tput.get(row["baseline"]), tput.get(row["candidate"])
        ratio = cand_tps / base_tps if base_tps and cand_tps else None
        acc = comparison["acceptance"].get(load, {}).get(row["candidate"], {})
        ci = f"[{fmt(tpot['ci_low'], digits=2)}, {fmt(tpot['ci_high'], digits=2)}]"
        rows.append(
            f"| {suite} | {load[1:]} | {fmt(tpot['baseline_p50'], 1000)} | "
            f"{fmt(tpot['candidate_p50'], 1000)} | {fmt(tpot['speedup'], digits=2)} {ci} | "
            f"{fmt(base_tps, digits=2)} | {fmt(cand_tps, digits=2)} | {fmt(ratio, digits=2)} | "
            f"{fmt(acc.get('mean_acceptance_length'), digits=2)} | "
            f"{fmt(row['exact_match_rate'], digits=2)} | "
            f"{tpot['n_baseline']}/{tpot['n_candidate']} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--model", args.model, "--dtype", args.dtype, "--max-model-len",
              str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs)]  # fmt: skip
    spec = [*common, "--draft-model", args.draft_model, "--draft-weights", args.draft_weights,
            "--num-speculative-tokens", args.num_speculative_tokens]  # fmt: skip
    if args.disable_by_batch_size:
        spec += ["--speculative-disable-by-batch-size", str(args.disable_by_batch_size)]
    t0 = time.perf_counter()
    # Started one after the other (loading is CPU-heavy); both stay up for the A/B batches.
    with (
        ServerProcess(common, log_path=out / "baseline.log", ready_timeout_s=900) as base,
        ServerProcess(spec, log_path=out / "speculative.log", ready_timeout_s=900) as cand,
    ):
        print(f"servers ready after {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        lines = [
            "| suite | conc | base TPOT ms (p50) | spec TPOT ms (p50) | TPOT speedup [95% CI] | "
            "base tok/s | spec tok/s | tput ratio | τ (accept len) | exact match | n TPOT |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for suite in args.suites.split(","):
            suite_out = out / suite
            run_suite(args, base.base_url, cand.base_url, suite, suite_out)
            comparison = json.loads((suite_out / "comparison.json").read_text())
            lines += summarize(suite, comparison)
            print(f"{suite} done at {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print("\n".join(lines))
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
