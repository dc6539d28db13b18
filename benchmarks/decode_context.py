"""One decode step of the main job's pair as the context grows: what attention adds to a step.

The draft (Qwen2.5-Coder-0.5B, int4 weights, marked as a draft as the engine builder marks it:
one-row matmuls on int8 x) and the target (Qwen2.5-Coder-1.5B, bf16 weights), both on the
native path (one ``*_decoder_layer`` op per layer), each run one token at a time after a
context of ``--contexts`` tokens; medians of ``--steps`` steps (forward and LM head), the
steps of every model and context taken in turn so that all see the same machine. A step's
weight reads do not grow with the context; its attention does (every layer reads the keys
and values of every earlier token), so the growth from the shortest context is what
attention costs there.

Comparing two versions of the code (attention kernels), run it from each checkout in turn:

    python benchmarks/decode_context.py
    python benchmarks/decode_context.py --contexts 100,300,600,1200 --steps 100

``--verify T``: instead, serve's default pair as served (the gguf 1.5B target, the int4 0.5B
draft marked as a draft) after each context, each model's forward over T new tokens (a
verify of T - 1 drafts) and over one token, with the fused layers' attention as it runs
(the default) and in its earlier form (``SPECSERVE_FAST_ATTENTION=0``: each query row on its
own, blocks of 4 keys, one value register's chain after the other) in alternation, so both
see the same machine; the two give the same bits (checked once per model and context;
both score keys as fp32 chains, ``SPECSERVE_BF16_SCORES=0``):

    python benchmarks/decode_context.py --verify 5 --contexts 8,800,2000 --steps 15

``--switch bf16-scores``: the other setting is instead the attention with its scores as fp32
chains per key (``SPECSERVE_BF16_SCORES=0``) against the default on AVX-512 BF16 builds, the
keys in lanes and scored by ``vdpbf16ps`` (``csrc/key_lanes.h``); their bits differ, so the
table gives the largest logit difference between the two instead:

    python benchmarks/decode_context.py --verify 5 --contexts 8,2000,4000 --switch bf16-scores

``--switch attention-amx``: the other setting is the attention on the vector units
(``SPECSERVE_ATTENTION_AMX=0``) against the default where the build has AMX BF16, scores and
value sums on the tiles (``csrc/attention_tiles.h``); other bits too:

    python benchmarks/decode_context.py --verify 5 --contexts 8,1000,4000 --switch attention-amx

Run it alone on the machine: it measures memory traffic.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading import load_model
from specserve.loading.quant_cache import load_in_format
from specserve.models.native import fused_layer

DRAFT, TARGET = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"


def context_ids(n: int) -> list[int]:
    """The ``n`` token ids every model and form decodes after (the same at every context)."""
    return [(13 * i + 7) % 1000 + 100 for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="100,300,600,1200", help="context lengths, tokens")
    ap.add_argument("--steps", type=int, default=60, help="one-token steps per model and context")
    ap.add_argument(
        "--verify", type=int, default=0, metavar="T",
        help="time T-token and one-token forwards, attention fast and earlier, instead",
    )  # fmt: skip
    ap.add_argument(
        "--switch", choices=sorted(SWITCHES), default="fast-attention",
        help="with --verify: the setting alternated with the default",
    )  # fmt: skip
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    if not contexts or min(contexts) < 1 or args.steps < 3:
        ap.error("--contexts must be positive lengths and --steps at least 3")
    if args.verify:
        if args.verify < 2:
            ap.error("--verify takes at least 2 tokens")
        return verify_part(contexts, args.steps, args.verify, args.switch)
    draft = load_in_format(DRAFT, "int4", torch.bfloat16).model
    fused_layer.set_draft(draft)
    target = load_model(TARGET, dtype=torch.bfloat16).model
    if not fused_layer.enable(target):
        raise SystemExit(f"the native path is off here: {fused_layer.why_not(target)}")
    print(f"draft: {fused_layer.describe(draft)}; target: {fused_layer.describe(target)}")
    # Every (context, model) pair holds its own cache; the steps go round all pairs in turn,
    # so that the growth with the context compares steps taken seconds apart.
    pairs: list[tuple[int, SingleSequenceCache, list[float]]] = []
    for n in contexts:
        ids = context_ids(n)
        for model in (draft, target):
            cache = SingleSequenceCache(model, n + 8)
            cache.forward(ids)
            pairs.append((n, cache, []))
    for _ in range(args.steps):
        for n, cache, t in pairs:
            t0 = time.perf_counter()
            cache.model.compute_logits(cache.forward([5]))
            t.append(time.perf_counter() - t0)
            cache.truncate(n)
    med = [statistics.median(t) * 1e3 for _, _, t in pairs]
    print("| context | draft step ms | target step ms | draft / target |")
    print("|---|---|---|---|")
    for j, n in enumerate(contexts):
        d, g = med[2 * j], med[2 * j + 1]
        print(f"| {n} | {d:.2f} (+{d - med[0]:.2f}) | {g:.1f} (+{g - med[1]:.1f}) | "
              f"{d / g:.3f} |")  # fmt: skip
    print(f"(+x: the growth over the {contexts[0]}-token context; {args.steps} steps, medians)")
    return 0


# --switch: the variable that turns the default off, whether both settings give the same
# bits, and the other setting's name in the table
SWITCHES = {
    "fast-attention": ("SPECSERVE_FAST_ATTENTION", True, "earlier"),
    "bf16-scores": ("SPECSERVE_BF16_SCORES", False, "fp32 scores"),
    "attention-amx": ("SPECSERVE_ATTENTION_AMX", False, "vector units"),
}


def verify_part(contexts: list[int], steps: int, tokens: int, switch: str) -> int:
    """``--verify``: each model's T-token and one-token forwards with the attention as it runs
    and with ``switch`` off, alternating, after each context."""
    variable, same_bits, other = SWITCHES[switch]
    if same_bits:  # both forms' scores as fp32 chains, the arithmetic they share
        os.environ["SPECSERVE_BF16_SCORES"] = "0"
    target = load_in_format(TARGET, "gguf", torch.bfloat16).model
    draft = load_in_format(DRAFT, "int4", torch.bfloat16).model
    fused_layer.set_draft(draft)
    for model in (target, draft):
        if not fused_layer.enable(model):
            raise SystemExit(f"the native path is off here: {fused_layer.why_not(model)}")
    print(f"target: {fused_layer.describe(target)}; draft: {fused_layer.describe(draft)}")
    dims = sorted({m.cfg.head_dim for m in (target, draft)})
    lanes = {d: torch.ops.specserve.fused_bf16_scores(d) for d in dims}
    print(f"attention scores in lanes (vdpbf16ps) now, by head dims: {lanes}")
    tiles = {d: torch.ops.specserve.fused_attention_tiles(d) for d in dims}
    print(f"attention on the AMX tiles now, by head dims: {tiles}")
    new = [(11 * i + 5) % 1000 + 100 for i in range(tokens)]
    cases = []
    for label, model in (("target", target), ("draft", draft)):
        for n in contexts:
            cache = SingleSequenceCache(model, n + tokens)
            cache.forward(context_ids(n))
            cases.append((label, n, cache))

    def forward(cache: SingleSequenceCache, n: int, ids: list[int], fast: bool):  # type: ignore[no-untyped-def]
        os.environ[variable] = "1" if fast else "0"
        t0 = time.perf_counter()
        logits = cache.model.compute_logits(cache.forward(ids))
        dt = time.perf_counter() - t0
        cache.truncate(n)
        return dt, logits

    gap: dict[tuple[str, int], float] = {}  # the largest logit difference (bits differ)
    for label, n, cache in cases:
        for ids in (new, new[:1]):
            a, b = forward(cache, n, ids, True)[1], forward(cache, n, ids, False)[1]
            if same_bits and not torch.equal(a, b):
                raise SystemExit(f"the two attention forms differ: {label}, context {n}")
            gap[(label, n)] = max(gap.get((label, n), 0.0), (a - b).float().abs().max().item())
    times: dict[tuple[str, int, int, bool], list[float]] = {}
    for step in range(steps):
        for label, n, cache in cases:
            for ids in (new, new[:1]):
                # the two settings in turn, first one then the other (the first forward of a
                # pair ran about 2 % slower when it always came first)
                for fast in (True, False) if step % 2 == 0 else (False, True):
                    key = (label, n, len(ids), fast)
                    times.setdefault(key, []).append(forward(cache, n, ids, fast)[0])
    os.environ.pop(variable, None)
    os.environ.pop("SPECSERVE_BF16_SCORES", None)
    med = {key: statistics.median(t) * 1e3 for key, t in times.items()}
    gap_head = "" if same_bits else " max logit diff |"
    print(f"| model | context | {tokens} tokens ms | {other} ms | {other} / now | "
          f"1 token ms | {other} ms | {other} / now |{gap_head}")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|" + ("" if same_bits else "---|"))
    for label, n, _ in cases:
        cells = []
        for t in (tokens, 1):
            a, b = med[(label, n, t, True)], med[(label, n, t, False)]
            cells.append(f"{a:.1f} | {b:.1f} | {b / a:.2f}")
        diff = "" if same_bits else f" {gap[(label, n)]:.3g} |"
        print(f"| {label} | {n} | {' | '.join(cells)} |{diff}")
    bits = "the same bits either way" if same_bits else "logits of both lengths compared"
    print(f"({steps} rounds, medians; {bits})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
