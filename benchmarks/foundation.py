"""Foundation benchmark: model load time (first vs cached) and plain decode speed vs transformers.

Run (it loads the 1.5B several times; keep other heavy jobs off the machine):

    .venv/bin/python benchmarks/foundation.py

Measured side by side in one run:

1. Loading ``qwen2.5-coder-1.5b-instruct``: the first load (GGUF dequantisation + writing the
   safetensors cache, into a temporary cache directory) and the cached load, per dtype; and
   transformers loading the same GGUF (``from_pretrained(gguf_file=...)``).
2. Decode tokens/s, batch 1, greedy, fixed length (EOS ignored), same chat prompt: ours
   (``specserve.spec_decode.plain_loop.generate_plain``) and transformers' ``generate``; decode time
   excludes prefill on both sides (transformers: time(N tokens) - time(1 token)). Also whether
   the greedy token ids are equal.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from specserve.bench.suites import get_prompts
from specserve.dtypes import FLOAT_WEIGHT_FORMATS
from specserve.loading import CATALOG, load_model
from specserve.loading.transport import fetch
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain

PROMPT = get_prompts("perf", ["palindrome"])[0].text  # the palindrome prompt of specserve perf
DTYPES = FLOAT_WEIGHT_FORMATS  # fp32, bf16


def _hf_load(path: Path, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=dtype
    ).eval()


def bench_load(name: str, dtypes: list[str], with_hf: bool) -> list[str]:
    """First load (fresh weight cache: dequantise + write) and cached load, per dtype."""
    path = fetch(CATALOG[name])
    rows = []
    old = os.environ.get("SPECSERVE_CACHE_DIR")
    for d in dtypes:
        tmp = tempfile.mkdtemp(prefix="specserve-bench-cache-")
        try:
            os.environ["SPECSERVE_CACHE_DIR"] = tmp
            t0 = time.perf_counter()
            lm = load_model(path, dtype=DTYPES[d])
            first = time.perf_counter() - t0
            del lm
            gc.collect()
            t0 = time.perf_counter()
            lm = load_model(path, dtype=DTYPES[d])
            cached = time.perf_counter() - t0
            del lm
            gc.collect()
        finally:
            if old is None:
                os.environ.pop("SPECSERVE_CACHE_DIR", None)
            else:
                os.environ["SPECSERVE_CACHE_DIR"] = old
            shutil.rmtree(tmp, ignore_errors=True)
        hf_s = float("nan")
        if with_hf:
            t0 = time.perf_counter()
            hf = _hf_load(path, DTYPES[d])
            hf_s = time.perf_counter() - t0
            del hf
            gc.collect()
        rows.append(
            f"| {name} | {d} | {first:.1f} | {cached:.2f} | {hf_s:.1f} | {hf_s / cached:.0f}x |"
        )
        print(rows[-1], flush=True)
    return rows


def _hf_decode(hf: Any, ids: list[int], num_tokens: int) -> tuple[float, list[int]]:
    x = torch.tensor([ids])

    def run(n: int) -> tuple[float, torch.Tensor]:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(
                x, max_new_tokens=n, min_new_tokens=n, do_sample=False, top_p=None, top_k=None
            )
        return time.perf_counter() - t0, out

    run(2)  # warm-up
    t1, _ = run(1)
    tn, out = run(num_tokens)
    return (num_tokens - 1) / (tn - t1), out[0, len(ids) :].tolist()


def bench_decode(name: str, dtypes: list[str], num_tokens: int) -> list[str]:
    rows = []
    hf32 = None
    for d in dtypes:
        lm = load_model(name, dtype=DTYPES[d])
        ids = lm.tokenizer.encode(
            lm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
        )
        params = SamplingParams(max_tokens=num_tokens, ignore_eos=True)
        generate_plain(lm.model, ids, SamplingParams(max_tokens=4, ignore_eos=True), ())
        res = generate_plain(lm.model, ids, params, lm.tokenizer.eos_token_ids)
        ours_tps, ours_ids, source = res.decode_tokens_per_s, res.token_ids, lm.source
        del lm, res
        gc.collect()
        if hf32 is None:
            hf32 = _hf_load(source, torch.float32)
        hf = hf32 if d == "fp32" else hf32.to(DTYPES[d])
        hf_tps, hf_ids = _hf_decode(hf, ids, num_tokens)
        if d != "fp32":
            hf32 = None  # the cast was in place (nn.Module.to); reload for a later fp32 run
            del hf
        gc.collect()
        match = sum(a == b for a, b in zip(ours_ids, hf_ids, strict=False)) / num_tokens
        first_diff = next(
            (i for i, (a, b) in enumerate(zip(ours_ids, hf_ids, strict=False)) if a != b), None
        )
        same = "yes" if first_diff is None else f"no (from token {first_diff})"
        rows.append(
            f"| {name} | {d} | {len(ids)} | {num_tokens} | {ours_tps:.2f} | {hf_tps:.2f} | "
            f"{ours_tps / hf_tps:.2f}x | {same} ({match:.0%}) |"
        )
        print(rows[-1], flush=True)
    del hf32
    gc.collect()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--models",
        default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct,qwen2.5-coder-1.5b-instruct",
    )
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--num-tokens", type=int, default=64)
    p.add_argument("--load-model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--skip-load", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--skip-hf-load", action="store_true", help="do not time transformers' load")
    args = p.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if d not in DTYPES:
            p.error(f"unknown dtype {d!r}; choose from {list(DTYPES)}")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}", flush=True)
    if not args.skip_load:
        print(
            "\n| model | dtype | first load s | cached load s | transformers load s | "
            "transformers / cached |\n|---|---|---|---|---|---|",
            flush=True,
        )
        bench_load(args.load_model, dtypes, not args.skip_hf_load)
    if not args.skip_decode:
        print(
            "\n| model | dtype | prompt tokens | new tokens | ours tok/s | transformers tok/s | "
            "ours / transformers | same greedy ids (match) |\n|---|---|---|---|---|---|---|---|",
            flush=True,
        )
        for name in [m for m in args.models.split(",") if m]:
            bench_decode(name, dtypes, args.num_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
