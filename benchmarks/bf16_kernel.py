"""The native bf16 path against PyTorch's, per matmul shape and per whole decoder step.

``--part matmul``: for the Qwen2.5-Coder-1.5B shapes, weight bytes read per second by
``specserve::bf16_gemm`` and by ``torch.nn.functional.linear`` (bf16) at M = 1, 5 and 16
rows; on a CPU whose bf16 matmul runs on the AMX tiles, also by ``bf16_gemm`` with
``SPECSERVE_BF16_AMX=0`` (its AVX-512 BF16 kernel), and on one where it runs on the AVX-512
BF16 or the AVX2 kernel, also with ``SPECSERVE_SWEEP_PREFETCH=0`` (each weight row's stream
prefetched on its own instead of the next block of rows in one sweep). Each timing rotates
over enough weight copies (>= 128 MB) that reads come from memory, not from the last-level
cache, as in real decoding; best of 3.

``--part step``: one forward of the 1.5B in bf16 over T = 1 to 8 new tokens at a
200-token context, on the native path (one ``bf16_decoder_layer`` op per layer and the
native LM head) and on the eager path (PyTorch's linears, ``fused_layer.disable``), the two
alternating on the same model so that both see the same machine; medians. Where the bf16
matmul runs on the AMX tiles, the native path also runs with them switched off
(``SPECSERVE_BF16_AMX=0``, read on every call) in the same alternation; where it runs on the
AVX-512 BF16 or AVX2 kernel, with its sweep prefetch switched off
(``SPECSERVE_SWEEP_PREFETCH=0``). It also says whether each path's T = 8 rows equal, bit for
bit, what eight T = 1 steps give (the condition for greedy speculative output to equal plain
output).

``--part thp``: the 1.5B's one-token step (logits included) with its streamed weights in
transparent huge pages (as the loader places them, models/native/huge_pages.py) and with the
same weights in ordinary 4 KiB pages (a deep copy of the model), the two models' steps
alternating; medians of ``--rounds`` each, and whether both give the same logits.

``--part prefill``: prompts of ``--prompt-tokens`` tokens of the 1.5B in bf16, prefilled on
the native path in chunks of ``prompt_chunk_rows`` tokens (128) (the fused layer ops; on
AMX tiles each matmul reads its weights once per chunk), on the native path in chunks of 16
(the earlier chunking: weights read once per 16 tokens) and on the eager path, alternating;
medians of ``--rounds``. Where the layers' attention runs on the AMX tiles, a fourth arm
takes chunks of 128 with the attention on the vector units (``SPECSERVE_ATTENTION_AMX=0``).
``--weights gguf``: the GGUF file's K-quants as serve runs them by default (chunks of 16), with
and without the tiles' attention (no eager arm: those layers dequantise on every call).
It also says whether the native prefill's last row equals, bit for bit, what feeding the
prompt one token at a time gives.

    python benchmarks/bf16_kernel.py --part matmul
    python benchmarks/bf16_kernel.py --part thp --rounds 40
    python benchmarks/bf16_kernel.py --part step
    python benchmarks/bf16_kernel.py --part prefill --rounds 3 --prompt-tokens 64,512,3000

Run it alone on the machine: it measures memory bandwidth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from specserve.models.native import bf16_native

SHAPES = [(1536, 2048), (1536, 1536), (1536, 17920), (8960, 1536), (1536, 151936)]  # K, N
ROWS = (1, 5, 16)
AMX_SWITCH = "SPECSERVE_BF16_AMX"
SWEEP_SWITCH = "SPECSERVE_SWEEP_PREFETCH"
FMA_SWITCH = "SPECSERVE_BF16_FMA"


def _amx_here() -> bool:
    return bf16_native.available() and bf16_native.kernel() == "AMX tiles"


def _set_amx(on: bool) -> None:
    os.environ[AMX_SWITCH] = "1" if on else "0"


def _sweep_here() -> bool:
    """The bf16 matmul runs on a kernel with the sweep prefetch (AVX-512 BF16 or AVX2)."""
    return bf16_native.available() and bf16_native.kernel() in ("AVX-512 BF16", "AVX2")


def _set_sweep(on: bool) -> None:
    os.environ[SWEEP_SWITCH] = "1" if on else "0"


def _fma_pairs_apart_from_tiles() -> bool:
    """The AVX-512 BF16 kernel (the tiles switched off where they run) takes its multi-row
    sums as FMA pairs by default here."""
    amx = os.environ.get(AMX_SWITCH)
    _set_amx(False)
    try:
        return bf16_native.available() and bf16_native.fma_pairs()
    finally:
        if amx is None:
            os.environ.pop(AMX_SWITCH)
        else:
            os.environ[AMX_SWITCH] = amx


def _set_fma(on: bool | None) -> None:
    """FMA pairs forced on or off, or (None) the library's own choice."""
    if on is None:
        os.environ.pop(FMA_SWITCH, None)
    else:
        os.environ[FMA_SWITCH] = "1" if on else "0"


def _best_of(fn: Callable[[], object], repeats: int, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def _rotating(
    matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    weights: list[torch.Tensor],
) -> Callable[[], object]:
    """``matmul(x, w)`` with the next of ``weights`` on each call."""
    turn = iter(range(1 << 62))
    return lambda: matmul(x, weights[next(turn) % len(weights)])


def part_matmul() -> None:
    amx, sweep = _amx_here(), _sweep_here()
    # The second native arm: the AVX-512 kernel where the tiles run, else the kernel without
    # its sweep prefetch.
    other = "AMX off" if amx else "sweep off" if sweep else ""
    extra = f" {other} ms | {other} GB/s | {other} / native |" if other else ""
    # Where the AVX-512 kernel takes its multi-row sums as FMA pairs: that kernel with
    # vdpbf16ps sums too (the same bits).
    pairs = _fma_pairs_apart_from_tiles()
    dp = "AMX off, vdpbf16ps" if amx else "vdpbf16ps"
    extra += f" {dp} ms | {dp} / native |" if pairs else ""
    print(
        "| K x N | M | native ms | native GB/s | torch ms | torch GB/s | torch / native |" + extra
    )
    print("|---|---|---|---|---|---|---|" + ("---|---|---|" if other else "") + "---|---|" * pairs)
    for k, n in SHAPES:
        nbytes = k * n * 2
        copies = max(1, (128 << 20) // nbytes)
        weights = [torch.randn(n, k).to(torch.bfloat16) for _ in range(copies)]
        for m in ROWS:
            x = torch.randn(m, k).to(torch.bfloat16)
            a = _best_of(_rotating(bf16_native.matmul, x, weights), 3, copies)
            b = _best_of(_rotating(torch.nn.functional.linear, x, weights), 3, copies)
            row = (
                f"| {k} x {n} | {m} | {a * 1e3:.2f} | {nbytes / a / 1e9:.1f} | {b * 1e3:.2f} | "
                f"{nbytes / b / 1e9:.1f} | {b / a:.2f} |"
            )
            if other:
                (_set_amx if amx else _set_sweep)(False)
                c = _best_of(_rotating(bf16_native.matmul, x, weights), 3, copies)
                (_set_amx if amx else _set_sweep)(True)
                row += f" {c * 1e3:.2f} | {nbytes / c / 1e9:.1f} | {c / a:.2f} |"
            if pairs:
                _set_amx(False)
                _set_fma(False)
                d = _best_of(_rotating(bf16_native.matmul, x, weights), 3, copies)
                _set_fma(None)
                _set_amx(True)
                row += f" {d * 1e3:.2f} | {d / a:.2f} |"
            print(row)


def part_step(rounds: int) -> None:
    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.loading import load_model
    from specserve.models.native import fused_layer

    model = load_model("qwen2.5-coder-1.5b-instruct", dtype=torch.bfloat16).model
    if not fused_layer.enable(model):
        raise SystemExit(f"the native path is off here: {fused_layer.why_not(model)}")
    context = [(13 * i + 7) % 1000 + 100 for i in range(200)]
    new = [311, 42, 977, 5, 1234, 88, 4021, 613]
    cache = SingleSequenceCache(model, 256)
    cache.forward(context)  # prefill: eager on both paths

    # (name, native path, AMX tiles on, sweep prefetch on, FMA pairs: None = the library's
    # choice)
    pairs = _fma_pairs_apart_from_tiles()
    paths: list[tuple[str, bool, bool, bool, bool | None]]
    paths = [("native (bf16_decoder_layer)", True, True, True, None)]
    if _amx_here():
        paths[0] = ("native, AMX tiles", True, True, True, None)
        off = "native, AMX off (AVX-512 BF16" + (", FMA pairs)" if pairs else ")")
        paths.append((off, True, False, True, None))
        if pairs:
            paths.append(("native, AMX off, vdpbf16ps sums", True, False, True, False))
    elif pairs:
        paths.append(("native, vdpbf16ps sums", True, True, True, False))
    elif _sweep_here():
        paths.append(("native, sweep prefetch off", True, True, False, None))
    paths.append(("eager (torch linears)", False, True, True, None))

    def use(native: bool, amx: bool, sweep: bool, fma: bool | None) -> None:
        (fused_layer.enable if native else fused_layer.disable)(model)
        _set_amx(amx)
        _set_sweep(sweep)
        _set_fma(fma)

    def step(native: bool, amx: bool, sweep: bool, fma: bool | None, tokens: list[int]) -> float:
        use(native, amx, sweep, fma)
        cache.truncate(len(context))
        t0 = time.perf_counter()
        model.compute_logits(cache.forward(tokens))
        return time.perf_counter() - t0

    widths = range(1, len(new) + 1)
    times: dict[tuple[str, int], list[float]] = {(p[0], t): [] for p in paths for t in widths}
    for _ in range(rounds):
        for name, native, amx, sweep, fma in paths:
            for t in widths:
                times[(name, t)].append(step(native, amx, sweep, fma, new[:t]))
    head = " | ".join(f"T = {t} ms" for t in widths)
    print(f"| path | {head} | T = 8 rows == eight T = 1 steps |")
    print("|---|" + "---|" * (len(new) + 1))
    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    for name, native, amx, sweep, fma in paths:
        use(native, amx, sweep, fma)
        cache.truncate(len(context))
        together = model.compute_logits(cache.forward(new))
        cache.truncate(len(context))
        one_by_one = torch.cat([model.compute_logits(cache.forward([tok])) for tok in new])
        same = torch.equal(together, one_by_one)
        cells = " | ".join(f"{med[(name, t)]:.1f}" for t in widths)
        print(f"| {name} | {cells} | {'yes' if same else 'no'} |")
    _set_amx(True)
    _set_sweep(True)
    _set_fma(None)
    first = paths[0][0]
    for name, *_ in paths[1:]:
        ratios = ", ".join(f"T = {t} {med[(name, t)] / med[(first, t)]:.2f}x" for t in widths)
        print(f"{name} / {first}: {ratios} ({rounds} rounds, medians)")


def part_thp(rounds: int) -> None:
    import copy

    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.loading import load_model
    from specserve.models.native import fused_layer, huge_pages

    if not huge_pages.available():
        raise SystemExit("transparent huge pages are not available here")
    huge = load_model("qwen2.5-coder-1.5b-instruct", dtype=torch.bfloat16).model
    held = huge_pages.resident_huge_bytes() or 0
    small = copy.deepcopy(huge)  # torch.empty copies: 4 KiB pages
    if not (fused_layer.enable(huge) and fused_layer.enable(small)):
        raise SystemExit(f"the native path is off here: {fused_layer.why_not(huge)}")
    print(f"resident in huge pages after loading: {held / 2**30:.2f} GiB")
    context = [(13 * i + 7) % 1000 + 100 for i in range(200)]
    models = {"huge pages": huge, "4 KiB pages": small}
    caches = {name: SingleSequenceCache(m, 256) for name, m in models.items()}
    logits = {}
    for name, cache in caches.items():
        cache.forward(context)
        logits[name] = models[name].compute_logits(cache.forward([311]))
        cache.truncate(len(context))
    times: dict[str, list[float]] = {name: [] for name in caches}
    for _ in range(rounds):
        for name, cache in caches.items():
            t0 = time.perf_counter()
            models[name].compute_logits(cache.forward([311]))
            times[name].append(time.perf_counter() - t0)
            cache.truncate(len(context))
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    for name, m in med.items():
        print(f"{name}: T = 1 median {m:.1f} ms")
    same = torch.equal(logits["huge pages"], logits["4 KiB pages"])
    ratio = med["4 KiB pages"] / med["huge pages"]
    print(f"4 KiB / huge pages: {ratio:.2f}x ({rounds} rounds); same logits: {same}")


def part_prefill(rounds: int, lengths: list[int], weights: str) -> None:
    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.loading import load_model
    from specserve.loading.quant_cache import load_in_format
    from specserve.models.native import fused_layer

    if weights == "bf16":
        model = load_model("qwen2.5-coder-1.5b-instruct", dtype=torch.bfloat16).model
    else:  # the file's own K-quants, as serve runs them by default
        model = load_in_format("qwen2.5-coder-1.5b-instruct", "gguf", torch.bfloat16).model
    if not fused_layer.enable(model):
        raise SystemExit(f"the native path is off here: {fused_layer.why_not(model)}")
    chunk = model.prompt_chunk_rows
    # name: (chunk rows or None for the eager path, attention on the AMX tiles)
    arms: dict[str, tuple[int | None, bool]] = {f"native, chunks of {chunk}": (chunk, True)}
    tiles = torch.ops.specserve.fused_attention_tiles(model.cfg.head_dim)
    if tiles:
        arms[f"chunks of {chunk}, attention on the vector units"] = (chunk, False)
    if chunk != 16:
        arms["native, chunks of 16"] = (16, True)
    if weights == "bf16":  # (a quantised model's eager layers dequantise: not a peer)
        arms["eager"] = (None, True)
    print(f"{fused_layer.describe(model)}; attention on the AMX tiles: {'yes' if tiles else 'no'}")
    print(f"median of {rounds} rounds, the arms alternating")
    others = list(arms)[1:]
    print(
        f"| prompt tokens | {' s | '.join(arms)} s | "
        + " | ".join(f"{name} / first" for name in others)
        + f" | chunks of {chunk} == one token at a time |"
    )
    print("|---|" + "---|" * (2 * len(arms)))
    for n in lengths:
        prompt = [(13 * i + 7) % 1000 + 100 for i in range(n)]
        cache = SingleSequenceCache(model, n + 16)
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(rounds):
            for name, (rows, on_tiles) in arms.items():
                os.environ["SPECSERVE_ATTENTION_AMX"] = "1" if on_tiles else "0"
                if rows:
                    fused_layer.enable(model)
                    model.prompt_chunk_rows = rows
                else:
                    fused_layer.disable(model)
                cache.truncate(0)
                t0 = time.perf_counter()
                cache.forward(prompt)
                times[name].append(time.perf_counter() - t0)
        os.environ.pop("SPECSERVE_ATTENTION_AMX", None)
        fused_layer.enable(model)
        same = "not checked"  # (a long prompt one token at a time takes minutes)
        if n <= 512:
            cache.truncate(0)
            whole = cache.forward(prompt)[-1:]
            cache.truncate(0)
            for token in prompt:
                last = cache.forward([token])
            same = "yes" if torch.equal(whole, last) else "no"
        med = {name: statistics.median(ts) for name, ts in times.items()}
        first = med[next(iter(arms))]
        cells = " | ".join(f"{t:.2f}" for t in med.values())
        ratios = " | ".join(f"{med[name] / first:.2f}" for name in others)
        print(f"| {n} | {cells} | {ratios} | {same} |")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--part", choices=["matmul", "step", "thp", "prefill"], required=True)
    p.add_argument("--rounds", type=int, default=15, help="alternations of --part step/prefill")
    p.add_argument(
        "--prompt-tokens", default="64,512,3000", help="--part prefill: prompt lengths, tokens"
    )
    p.add_argument(
        "--weights",
        choices=["bf16", "gguf"],
        default="bf16",
        help="--part prefill: the 1.5B's bf16 weights, or its GGUF file's K-quants as stored",
    )
    args = p.parse_args()
    if not bf16_native.available():
        raise SystemExit(f"native bf16 kernel unavailable: {bf16_native.unavailable_reason()}")
    if args.part == "matmul":
        part_matmul()
    elif args.part == "prefill":
        part_prefill(args.rounds, [int(n) for n in args.prompt_tokens.split(",")], args.weights)
    elif args.part == "thp":
        part_thp(args.rounds)
    else:
        part_step(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
