"""``specserve perf --profile``: where one decode step's time goes, before and after the fast
path (RoPE tables, torch.compile), per weight format — with the compile time."""

from __future__ import annotations

import time

import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.models.fast_path import FastPathOptions, optimize_for_decode, profile_step


def _decode_step(model: DecoderLM, context: int) -> tuple[SingleSequenceCache, list[int]]:
    cache = SingleSequenceCache(model, context + 8)
    cache.forward(list(range(100, 100 + context)))
    return cache, [42]


def profile_decode(
    model: DecoderLM, label: str, context: int = 128, steps: int = 5, compile: bool = False
) -> None:
    """Print the step time and top ops of a batch-1 decode step at ``context`` tokens, eager,
    then with RoPE tables, then (``compile``) compiled; the model is modified in place."""
    cache, tok = _decode_step(model, context)

    def step() -> None:
        with torch.inference_mode():
            model.compute_logits(cache.forward(tok))
        cache.truncate(context)

    stages = [
        ("eager", None),
        ("rope tables", FastPathOptions(rope_tables=True)),
        ("compiled", FastPathOptions(rope_tables=True, compile=True)),
    ][: 3 if compile else 2]
    for name, options in stages:
        compile_s = 0.0
        if options is not None:
            optimize_for_decode(model, options)
        if options is not None and options.compile:
            t0 = time.perf_counter()
            step()  # first call compiles
            compile_s = time.perf_counter() - t0
        prof = profile_step(step, num_steps=steps)
        extra = f", compile {compile_s:.1f} s" if compile_s else ""
        print(
            f"\n{label} decode step ({name}): {prof.step_ms:.1f} ms, "
            f"{prof.num_ops_per_step:.0f} aten calls/step{extra}"
        )
        for op, ms, calls in prof.top_ops:
            print(f"  {op:<40} {ms:8.2f} ms/step {calls:6.0f} calls/step")
