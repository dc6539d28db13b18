"""The native int8-group kernel beside the native int4 kernel, per matmul shape.

For two Qwen2.5-Coder-1.5B shapes, the MLP down projection (N = 1536, K = 8960) and the LM head
(N = 151936, K = 1536), the time of one ``specserve::int8_gemm`` call (group size 16, the
GGUF K-quants' sub-block) and of one ``specserve::int4_gemm`` call (group size 32) at
M = 1, 2, 5, 8 and 16 rows, and the weight bytes each call reads (packed codes + fp16 scales)
per second. Each timing rotates over enough weight copies (~100 MB) that reads come from
memory, not from the last-level cache, as in real decoding; best of 3.

    python benchmarks/int8_group_kernel.py
    python benchmarks/int8_group_kernel.py --rows 1 5 --shape down

Run it alone on the machine: it measures memory bandwidth.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

SHAPES = {"down": (1536, 8960), "lm_head": (151936, 1536)}  # N, K
INT8_GROUP = 16
INT4_GROUP = 32
ROTATE_BYTES = 100e6


class _Weight:
    """Random codes with group scales and offsets (the shape of an Int8GroupWeight)."""

    def __init__(self, n: int, k: int, gen: torch.Generator) -> None:
        self.group_size = INT8_GROUP
        self.codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
        self.scale = torch.rand(n, k // INT8_GROUP, generator=gen) * 1e-3 + 1e-4
        self.offset = torch.randn(n, k // INT8_GROUP, generator=gen) * 1e-3


def _int4_weight(n: int, k: int, gen: torch.Generator):  # type: ignore[no-untyped-def]
    from specserve.models.quant.int4_weight import Int4Weight

    nibbles = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    scale = torch.rand(n, k // INT4_GROUP, generator=gen) * 0.01 + 1e-3
    return Int4Weight(nibbles, scale, -7.5 * scale, INT4_GROUP)


def _seconds_per_call(fn: Callable[[object], object], weights: list, budget_s: float) -> float:  # type: ignore[type-arg]
    for w in weights:
        fn(w)
    t0 = time.perf_counter()
    fn(weights[0])
    rounds = max(1, int(budget_s / ((time.perf_counter() - t0) * len(weights))))
    t0 = time.perf_counter()
    for _ in range(rounds):
        for w in weights:
            fn(w)
    return (time.perf_counter() - t0) / (rounds * len(weights))


def _best(fn: Callable[[object], object], weights: list, budget_s: float) -> float:  # type: ignore[type-arg]
    return min(_seconds_per_call(fn, weights, budget_s) for _ in range(3))


def run(shapes: list[str], rows: list[int], budget_s: float, with_int4: bool) -> None:
    from specserve.models.native import int4_native, int8_native

    if not int8_native.available():
        raise SystemExit(
            f"native int8-group kernel unavailable: {int8_native.unavailable_reason()}"
        )
    with_int4 = with_int4 and int4_native.available()
    gen = torch.Generator().manual_seed(0)
    print(f"threads: {torch.get_num_threads()}")
    print("| shape | N x K | M | int8 G=16 ms | int8 GB/s | int4 G=32 ms | int4 GB/s |")
    print("|---|---|---|---|---|---|---|")
    for name in shapes:
        n, k = SHAPES[name]
        copies = max(1, int(ROTATE_BYTES // (n * k)))
        int8_packed = [int8_native.pack(_Weight(n, k, gen)) for _ in range(copies)]
        int4_packed = []
        if with_int4:
            int4_copies = max(1, int(ROTATE_BYTES // (n * k // 2)))
            int4_packed = [int4_native.pack(_int4_weight(n, k, gen)) for _ in range(int4_copies)]
        for m in rows:
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
            t8 = _best(lambda p, x=x: int8_native.matmul(x, p), int8_packed, budget_s)
            gb8 = int8_packed[0].nbytes() / t8 / 1e9
            int4_cols = "- | -"
            if int4_packed:
                t4 = _best(lambda p, x=x: int4_native.matmul(x, p), int4_packed, budget_s)
                int4_cols = f"{t4 * 1e3:.3f} | {int4_packed[0].nbytes() / t4 / 1e9:.1f}"
            print(
                f"| {name} | {n} x {k} | {m} | {t8 * 1e3:.3f} | {gb8:.1f} | {int4_cols} |",
                flush=True,
            )
        del int8_packed, int4_packed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 5, 8, 16], help="values of M")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per timing round")
    ap.add_argument("--no-int4", action="store_true", help="time the int8-group kernel only")
    args = ap.parse_args()
    run(args.shape, args.rows, args.budget, not args.no_int4)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
