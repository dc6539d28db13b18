"""Batch-1 speculative decoding vs plain decoding, side by side in one run.

Loads the target (default Qwen2.5-Coder-1.5B-Instruct) and the draft (0.5B), then for every
prompt of the registry suites ``mini-structured`` (repeat a line, count, fill a JSON template,
a small code edit) and ``mini-open-ended`` (prose, explanations) runs each *arm* back to
back: plain decoding, draft-model speculation at fixed k, prompt lookup (n-gram), suffix
matching, and the adaptive k controller (over the draft model and over n-gram). Prints per
prompt and per suite:

- TPOT (decode time per output token after the first) and the speedup TPOT_plain / TPOT_arm
  (per suite: the geometric mean over its prompts),
- acceptance rate, mean acceptance length, per-position acceptance (vLLM definitions),
- the exact-match rate of each arm's tokens against plain decoding of the same prompt (bf16
  may flip near-ties: a k + 1 token verify runs different kernels than a 1 token step).

Heavy (loads two models, ~10-15 minutes on 2 cores): run it alone on the machine, e.g.

    flock "$LOCKFILE" .venv/bin/python benchmarks/speculative_batch1.py --output spec_bench.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from specserve.bench.suites import get_suite
from specserve.config import WEIGHT_FORMATS
from specserve.dtypes import torch_dtype
from specserve.loading import load_model
from specserve.loading.quant_cache import load_in_format
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.draft_model import check_vocab_compatible
from specserve.spec_decode.factory import make_proposer
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.plain_loop import GenerationResult, generate_plain
from specserve.spec_decode.proposer import Proposer
from specserve.spec_decode.speculative_loop import SpecGenerationResult, generate_speculative
from specserve.spec_decode.stats import SpecDecodingStats

SUITES = ("mini-structured", "mini-open-ended")  # registry suites (specserve.bench.suites)

ARMS = [
    "plain",
    "draft-k3",
    "draft-k5",
    "draft-auto",
    "hybrid-auto",
    "ngram-k8",
    "ngram-auto",
    "suffix-k8",
]


@dataclass
class Run:
    """One arm on one prompt."""

    tokens: list[int]
    tpot_s: float
    stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    mean_k: float = 0.0


def tpot(res: GenerationResult) -> float:
    n = len(res.token_ids) - 1
    return res.decode_s / n if n > 0 else math.nan


def parse_arm(arm: str) -> tuple[str, int | None]:
    """``draft-k3`` -> ("draft", 3); ``ngram-auto`` -> ("ngram", None)."""
    method, _, k = arm.partition("-")
    return method, None if k == "auto" else int(k.removeprefix("k"))


def geomean(values: list[float]) -> float:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument(
        "--draft-weights",
        choices=WEIGHT_FORMATS,
        default=None,
        help="the draft's weight format (int8/int4: weight-only; default: --dtype)",
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms")
    ap.add_argument("--suites", default=",".join(SUITES), help="comma-separated registry suites")
    ap.add_argument("--output", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    arms = args.arms.split(",")
    assert arms[0] == "plain", "the first arm must be plain (speedups are relative to it)"
    dtype = torch_dtype(args.dtype)
    torch.manual_seed(0)

    t0 = time.perf_counter()
    target = load_model(args.target, dtype=dtype)
    draft = None
    if any(a.startswith(("draft", "hybrid")) for a in arms):
        draft_lm = load_in_format(args.draft, args.draft_weights, dtype)
        check_vocab_compatible(
            target.arch.vocab_size, draft_lm.arch.vocab_size, target.tokenizer, draft_lm.tokenizer
        )
        draft = draft_lm.model
    dw = args.draft_weights or args.dtype
    print(
        f"loaded {args.target} ({args.dtype}) + {args.draft} ({dw}) "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    tok = target.tokenizer
    eos = tuple(tok.eos_token_ids)
    params = SamplingParams(max_tokens=args.max_tokens)
    max_len = 1024
    proposers: dict[str, Proposer] = {}
    controllers: dict[str, KController] = {}
    for arm in arms[1:]:
        method, k = parse_arm(arm)
        if method not in proposers:
            proposers[method] = make_proposer(
                method, target.arch.vocab_size, draft, max_model_len=max_len
            )
        if k is None:
            controllers[arm] = KController(args.k_max)  # learns across prompts, like a server

    # Warm up every code path once (first calls allocate and pick kernels).
    warm = list(tok.encode("def f(x):\n    return x", add_special_tokens=True))
    generate_plain(target.model, warm, SamplingParams(max_tokens=4), eos)
    for method, proposer in proposers.items():
        generate_speculative(
            target.model,
            proposer,
            warm,
            SamplingParams(max_tokens=6),
            eos,
            3,
            request_id=f"warm-{method}",
        )

    results: dict[str, dict[str, dict[str, Run]]] = {}
    for suite in args.suites.split(","):
        results[suite] = {}
        suite_prompts = get_suite(suite)
        for prompt in suite_prompts:
            name = prompt.id
            text = tok.apply_chat_template([{"role": "user", "content": prompt.text}])
            ids = list(tok.encode(text, add_special_tokens=False))
            runs: dict[str, Run] = {}
            for arm in arms:
                if arm == "plain":
                    res: GenerationResult = generate_plain(target.model, ids, params, eos)
                    runs[arm] = Run(res.token_ids, tpot(res))
                else:
                    method, k = parse_arm(arm)
                    sres: SpecGenerationResult = generate_speculative(
                        target.model,
                        proposers[method],
                        ids,
                        params,
                        eos,
                        controllers[arm] if k is None else k,
                        request_id=f"{name}-{arm}",
                    )
                    mean_k = sum(sres.k_history) / max(1, len(sres.k_history))
                    runs[arm] = Run(sres.token_ids, tpot(sres), sres.stats, mean_k)
                r = runs[arm]
                speedup = runs["plain"].tpot_s / r.tpot_s
                print(
                    f"{suite:15s} {name:13s} {arm:10s} n={len(r.tokens):3d} "
                    f"tpot={r.tpot_s * 1000:7.1f} ms speedup={speedup:5.2f}x "
                    f"acc={r.stats.acceptance_rate:.2f} len={r.stats.mean_acceptance_length:.2f} "
                    f"k={r.mean_k:.1f} exact={r.tokens == runs['plain'].tokens}",
                    flush=True,
                )
            results[suite][name] = runs
            if name == suite_prompts[0].id:
                print(f"  sample output ({name}): {tok.decode(runs['plain'].tokens)[:160]!r}")

    summary = summarize(results, arms)
    print_summary(summary, arms)
    if args.output:
        dump = {
            "args": vars(args),
            "summary": summary,
            "runs": {
                s: {
                    p: {
                        a: {
                            "tokens": r.tokens,
                            "tpot_s": r.tpot_s,
                            "mean_k": r.mean_k,
                            "stats": r.stats.to_dict(),
                        }
                        for a, r in runs.items()
                    }
                    for p, runs in prompts.items()
                }
                for s, prompts in results.items()
            },
        }
        with open(args.output, "w") as f:
            json.dump(dump, f, indent=1)
    return 0


def summarize(results: dict[str, dict[str, dict[str, Run]]], arms: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for suite, prompts in results.items():
        rows = {}
        for arm in arms:
            stats = SpecDecodingStats()
            for runs in prompts.values():
                stats.merge(runs[arm].stats)
            rows[arm] = {
                "speedup_geomean": geomean(
                    [runs["plain"].tpot_s / runs[arm].tpot_s for runs in prompts.values()]
                ),
                "tpot_ms_mean": 1000 * sum(r[arm].tpot_s for r in prompts.values()) / len(prompts),
                "exact_match_rate": sum(
                    r[arm].tokens == r["plain"].tokens for r in prompts.values()
                )
                / len(prompts),
                "acceptance_rate": stats.acceptance_rate,
                "mean_acceptance_length": stats.mean_acceptance_length,
                "acceptance_per_pos": [round(a, 3) for a in stats.acceptance_rate_per_pos()],
            }
        out[suite] = rows
    return out


def print_summary(summary: dict[str, Any], arms: list[str]) -> None:
    print(
        "\n| suite | arm | TPOT speedup (geomean) | mean TPOT ms | acceptance rate | "
        "mean acceptance length | exact match vs plain | per-position acceptance |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for suite, rows in summary.items():
        for arm in arms:
            r = rows[arm]
            per_pos = " ".join(f"{a:.2f}" for a in r["acceptance_per_pos"])
            print(
                f"| {suite} | {arm} | {r['speedup_geomean']:.2f}x | {r['tpot_ms_mean']:.0f} | "
                f"{r['acceptance_rate']:.2f} | {r['mean_acceptance_length']:.2f} | "
                f"{r['exact_match_rate']:.2f} | {per_pos} |"
            )
    for suite, rows in summary.items():
        for method in ("draft", "ngram", "suffix"):
            fixed = {
                a: r["speedup_geomean"] for a, r in rows.items() if a.startswith(method + "-k")
            }
            auto = rows.get(f"{method}-auto")
            if fixed and auto:
                best = max(fixed, key=lambda a: fixed[a])
                print(
                    f"{suite}: {method}-auto {auto['speedup_geomean']:.2f}x vs best fixed {best} "
                    f"{fixed[best]:.2f}x ({auto['speedup_geomean'] / fixed[best]:.2f} of it)"
                )


if __name__ == "__main__":
    raise SystemExit(main())
