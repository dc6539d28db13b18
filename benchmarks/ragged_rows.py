"""One verify forward of a batch whose requests verify different numbers of tokens, with the
rows ragged (a row per token, ``engine/model_runner.py``) and padded to the longest, in turn.

Four requests (by default) hold ``--context`` tokens each in the target's KV cache; the
forward runs ``--lengths`` tokens for them (e.g. 1,1,1,6: three plain rows and one request
verifying 5 drafts, 9 tokens ragged and 24 padded). Prints the median time of each layout
per context length and their ratio; the ragged layout's attention reads each row's context
on its own, so long contexts are where it could lose::

    .venv/bin/python benchmarks/ragged_rows.py --model qwen2.5-coder-1.5b-instruct \\
        --weights bf16 --contexts 200,900,2000 --lengths 1,1,1,6

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specserve.engine.model_runner import ForwardRow, ModelRunner
from specserve.loading.quant_cache import load_model_with_weights
from specserve.models.fast_path import optimize_for_decode

BLOCK = 16
PREFILL_CHUNK = 256


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--weights", default="bf16", help="a weight format (specserve serve)")
    p.add_argument("--contexts", default="200,900,2000", help="cached tokens per request")
    p.add_argument("--lengths", default="1,1,1,6", help="tokens each request's row runs")
    p.add_argument("--rounds", type=int, default=5, help="alternations of the two layouts")
    args = p.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    lengths = [int(n) for n in args.lengths.split(",")]
    if min(contexts) < 1 or min(lengths) < 1 or args.rounds < 1:
        p.error("--contexts, --lengths and --rounds must be positive")
    model = optimize_for_decode(load_model_with_weights(args.model, args.weights).model)
    print(f"{args.model} {args.weights}, native layers: {model.fused_layers}; rows {lengths}: "
          f"{sum(lengths)} tokens ragged, {len(lengths) * max(lengths)} padded")  # fmt: skip
    print("| context | ragged ms | padded ms | padded / ragged |")
    print("|---|---|---|---|")
    for ctx in contexts:
        per_seq = (ctx + max(lengths)) // BLOCK + 1
        runner = ModelRunner(model, model.make_kv_cache(1 + len(lengths) * per_seq, BLOCK))
        tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(len(lengths))]
        gen = torch.Generator().manual_seed(0)
        for table in tables:  # each request's context, in prompt chunks
            ids = torch.randint(0, model.cfg.vocab_size, (ctx,), generator=gen).tolist()
            for s in range(0, ctx, PREFILL_CHUNK):
                runner.execute([ForwardRow(ids[s : s + PREFILL_CHUNK], s, table, 1)])
        rows = [ForwardRow([7] * n, ctx, t, n) for n, t in zip(lengths, tables, strict=True)]
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(2 * args.rounds):
            runner.ragged_rows = r % 2 == 0
            t0 = time.perf_counter()
            runner.execute(rows)
            times[runner.ragged_rows].append(time.perf_counter() - t0)
        ragged, padded = (1e3 * statistics.median(times[k]) for k in (True, False))
        print(f"| {ctx} | {ragged:.1f} | {padded:.1f} | {padded / ragged:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
