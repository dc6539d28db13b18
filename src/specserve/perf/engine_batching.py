"""Engine throughput benchmark: sequential batch-1 decoding vs the continuous-batching engine,
with and without speculation, measured side by side in one run on the same prompts.

A module of its own, not a ``specserve perf`` option (``specserve perf`` is batch 1; this
measures the engine's batching)::

    python -m specserve.perf.engine_batching --model smollm2-135m-instruct --num-requests 8

The prompts are the registry suite ``mixed`` (specserve.bench.suites), request ``i`` taking
its prompt ``i`` modulo 8. Prints one row per arm: wall time, generated tokens, aggregate
tokens/s, the ratio to the sequential baseline and the greedy exact-match rate against it
(fp32 should give 1.00).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specserve.bench.suites import get_suite
from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.dtypes import DTYPES
from specserve.engine.builder import build_engine_from_models
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain

PROMPT_SUITE = "mixed"


@dataclass
class BatchingArmResult:
    """One arm of the batching benchmark: all requests, their outputs and the wall time."""

    name: str
    wall_s: float
    num_tokens: int
    outputs: dict[str, list[int]]
    mean_acceptance_length: float | None = None
    mean_k: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s


def run_sequential(  # type: ignore[no-untyped-def]
    lm, prompts: dict[str, list[int]], params: SamplingParams
) -> BatchingArmResult:
    eos = tuple(lm.tokenizer.eos_token_ids)
    t0 = time.perf_counter()
    outs = {rid: generate_plain(lm.model, p, params, eos).token_ids for rid, p in prompts.items()}
    wall = time.perf_counter() - t0
    return BatchingArmResult("sequential batch-1", wall, sum(map(len, outs.values())), outs)


def run_engine(  # type: ignore[no-untyped-def]
    lm, prompts: dict[str, list[int]], params: SamplingParams, spec: SpecConfig, args
) -> BatchingArmResult:
    config = EngineConfig(
        model=ModelConfig(lm.name, dtype=args.dtype, max_model_len=2048),
        cache=CacheConfig(block_size=16, memory_bytes=args.kv_cache_mib << 20),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
        ),
        spec=spec,
    )
    engine = build_engine_from_models(config, lm.model, lm.tokenizer, model_name=lm.name)
    outs: dict[str, list[int]] = {rid: [] for rid in prompts}
    t0 = time.perf_counter()
    for rid, p in prompts.items():
        engine.add_request(rid, p, params)
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id].extend(o.new_token_ids)
    wall = time.perf_counter() - t0
    k = spec.num_speculative_tokens
    name = (
        "engine, no speculation"
        if not spec.enabled
        else (f"engine, {spec.method} k={k if k is not None else 'adaptive'}")
    )
    stats = engine.stats()
    mal = stats.spec.mean_acceptance_length if spec.enabled else None
    counts = stats.k_chosen_counts
    mean_k = sum(k * n for k, n in counts.items()) / sum(counts.values()) if counts else None
    return BatchingArmResult(name, wall, sum(map(len, outs.values())), outs, mal, mean_k)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--kv-cache-mib", type=int, default=512)
    parser.add_argument("--spec", nargs="*", default=["ngram:4", "suffix:4", "ngram:adaptive"],
                        help="speculative arms as method:k (k may be 'adaptive')")  # fmt: skip
    args = parser.parse_args(argv)

    from specserve.loading import load_model

    lm = load_model(args.model, dtype=DTYPES[args.dtype], device="cpu")
    questions = [p.text for p in get_suite(PROMPT_SUITE)]
    prompts = {}
    for i in range(args.num_requests):
        q = questions[i % len(questions)]
        prompts[f"r{i}"] = lm.tokenizer.encode_chat([{"role": "user", "content": q}])
    params = SamplingParams(max_tokens=args.max_tokens)
    torch.set_grad_enabled(False)

    base = run_sequential(lm, prompts, params)
    arms = [base, run_engine(lm, prompts, params, SpecConfig(), args)]
    for arm in args.spec:
        method, _, k = arm.partition(":")
        spec = SpecConfig(method=method, num_speculative_tokens=None if k == "adaptive" else int(k))  # type: ignore[arg-type]
        arms.append(run_engine(lm, prompts, params, spec, args))

    print(f"model={args.model} dtype={args.dtype} requests={args.num_requests} "
          f"max_tokens={args.max_tokens} max_num_seqs={args.max_num_seqs} "
          f"threads={torch.get_num_threads()}")  # fmt: skip
    print(f"{'arm':32} {'wall_s':>8} {'tokens':>7} {'tok/s':>8} {'vs seq':>7} {'match':>6} "
          f"{'tau':>5} {'mean k':>6}")  # fmt: skip
    for a in arms:
        match = sum(a.outputs[r] == base.outputs[r] for r in prompts) / len(prompts)
        tau = f"{a.mean_acceptance_length:.2f}" if a.mean_acceptance_length else "-"
        mean_k = f"{a.mean_k:.2f}" if a.mean_k is not None else "-"
        ratio = a.tokens_per_s / base.tokens_per_s
        print(f"{a.name:32} {a.wall_s:8.2f} {a.num_tokens:7d} {a.tokens_per_s:8.2f} "
              f"{ratio:6.2f}x {match:6.2f} {tau:>5} {mean_k:>6}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
