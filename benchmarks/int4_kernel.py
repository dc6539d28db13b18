"""The native int4 kernel against PyTorch's, per matmul shape and per whole decoder step.

``--part matmul``: for the Qwen2.5-Coder-1.5B shapes, weight bytes read per second by
``specserve::int4_gemm`` and by ``aten::_weight_int4pack_mm_for_cpu`` at M = 1 and M = 5.
Each timing rotates over enough weight copies (~100 MB) that reads come from memory, not
from the last-level cache, as in real decoding; best of 3.

``--part step``: median time of one target forward over T = 1, 2, 5, 8 new tokens at a
200-token context (the invariant-context setup of ``specserve perf``), int4 weights, with
whichever int4 kernel ``Int4Linear`` picks (set ``SPECSERVE_INT4_NATIVE=0`` for PyTorch's),
and the number of operator calls one decode step dispatches. ``SPECSERVE_FUSED_LAYER=0``
runs the eager layers instead of one native op per layer (models/native/fused_layer.py).

``--part thp``: the same 1-token step with the packed weights in transparent huge pages
(models/native/huge_pages.py, as loaded) and in ordinary 4 KiB pages (a deep copy of the model),
the two models' steps alternating so that both see the same machine; medians of 60 each.
Then the read-bandwidth sum of ``specserve perf`` over 1 GiB in either kind of page.

``--part draft`` (AVX2 builds): a draft model's one-row int4 calls with x exact and with x
rounded to int8 per group (``fused_layer.set_draft``), alternating: per matmul of the 0.5B's
shapes, per one-token step of ``--model``, and how often the two give the same greedy token.

    python benchmarks/int4_kernel.py --part matmul
    python benchmarks/int4_kernel.py --part step
    SPECSERVE_INT4_NATIVE=0 python benchmarks/int4_kernel.py --part step
    SPECSERVE_FUSED_LAYER=0 python benchmarks/int4_kernel.py --part step
    python benchmarks/int4_kernel.py --part thp
    python benchmarks/int4_kernel.py --part draft --model qwen2.5-coder-0.5b-instruct

Run it alone on the machine: it measures memory bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from specserve.models.quant.int4_weight import Int4Weight

SHAPES = [(1536, 1536), (1536, 256), (1536, 8960), (8960, 1536), (1536, 151936)]  # K, N
GROUP = 64


def _random_weight(n: int, k: int) -> Int4Weight:
    nibbles = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    scale = torch.rand(n, k // GROUP) * 0.01 + 1e-3
    return Int4Weight(nibbles, scale, -8 * scale + torch.randn(n, k // GROUP) * 1e-3, GROUP)


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


def matmul_part() -> None:
    from specserve.models.native import int4_native

    if not int4_native.available():
        raise SystemExit(f"native int4 kernel unavailable: {int4_native.unavailable_reason()}")
    torch.manual_seed(0)
    print("| K x N | M | ours us | ours GB/s | torch us | torch GB/s | speedup |")
    print("|---|---|---|---|---|---|---|")
    for k, n in SHAPES:
        copies = max(1, int(100e6 // (k * n // 2)))
        ours, theirs = [], []
        for _ in range(copies):
            w = _random_weight(n, k)
            ours.append(int4_native.pack(w))
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                w.codes().to(torch.int32), 1
            )
            sz = torch.stack([w.scale, w.minimum + 8 * w.scale], -1).transpose(0, 1)
            theirs.append((packed, sz.contiguous().to(torch.bfloat16)))
        ours_bytes = ours[0].nbytes()
        theirs_bytes = theirs[0][0].numel() + theirs[0][1].numel() * 2
        for m in (1, 5):
            x = torch.randn(m, k, dtype=torch.bfloat16)
            t_ours = min(
                _seconds_per_call(lambda p, x=x: int4_native.matmul(x, p), ours, 0.15)
                for _ in range(3)
            )
            t_theirs = min(
                _seconds_per_call(
                    lambda w, x=x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, w[0], GROUP, w[1]),
                    theirs,
                    0.15,
                )
                for _ in range(3)
            )
            print(
                f"| {k} x {n} | {m} | {t_ours * 1e6:.0f} | {ours_bytes / t_ours / 1e9:.1f} | "
                f"{t_theirs * 1e6:.0f} | {theirs_bytes / t_theirs / 1e9:.1f} | "
                f"{t_theirs / t_ours:.2f}x |",
                flush=True,
            )


def _load_int4(model_name: str):  # type: ignore[no-untyped-def]
    from specserve.loading.quant_cache import load_in_format
    from specserve.models.fast_path import FastPathOptions, optimize_for_decode

    lm = load_in_format(model_name, "int4", torch.bfloat16)
    model = optimize_for_decode(lm.model, FastPathOptions(invariant_context_bucket=128))
    print(f"{model_name}: lm_head {model.lm_head.extra_repr()}, fused layers {model.fused_layers}")
    return model


def _cache_at_200(model):  # type: ignore[no-untyped-def]
    from specserve.kv_cache.single_sequence import SingleSequenceCache

    cache = SingleSequenceCache(model, 512)
    cache.forward(list(range(100, 300)))
    return cache


def step_part(model_name: str) -> None:
    model = _load_int4(model_name)
    cache = _cache_at_200(model)
    base = cache.num_tokens
    for t in (1, 2, 5, 8):
        times = []
        for _ in range(12):
            t0 = time.perf_counter()
            hidden = cache.forward(list(range(5, 5 + t)))
            model.compute_logits(hidden)
            times.append(time.perf_counter() - t0)
            cache.truncate(base)
        print(f"T = {t}: {1000 * statistics.median(times[2:]):.1f} ms", flush=True)
    print(f"ops dispatched by one decode step: {_count_ops(lambda: cache.forward([5]))}")


def thp_part(model_name: str) -> None:
    import copy

    from specserve.models.native import fused_layer, huge_pages

    if not huge_pages.available():
        raise SystemExit("transparent huge pages are not available here")
    huge = _load_int4(model_name)
    held = huge_pages.resident_huge_bytes() or 0
    small = copy.deepcopy(huge)  # torch.empty copies: 4 KiB pages
    if huge.fused_layers:
        fused_layer.enable(small)  # the copy's own tensors
    print(f"resident in huge pages: {held / 2**20:.0f} MiB after loading")
    caches = {"huge pages": _cache_at_200(huge), "4 KiB pages": _cache_at_200(small)}
    times: dict[str, list[float]] = {name: [] for name in caches}
    for _ in range(60):
        for name, cache in caches.items():
            t0 = time.perf_counter()
            cache.model.compute_logits(cache.forward([5]))
            times[name].append(time.perf_counter() - t0)
            cache.truncate(200)
    medians = {name: statistics.median(t[5:]) for name, t in times.items()}
    for name, m in medians.items():
        print(f"{name}: T = 1 median {1000 * m:.1f} ms")
    print(f"huge / 4 KiB step time: {medians['huge pages'] / medians['4 KiB pages']:.3f}")
    del caches, huge, small
    n = (1 << 30) // 4  # the read-bandwidth sum of `specserve perf`, in both kinds of pages
    buffers = {"huge pages": huge_pages.empty((n,), torch.float32), "4 KiB pages": torch.empty(n)}
    before = huge_pages.resident_huge_bytes() or 0
    for x in buffers.values():
        x.uniform_()
    gained = (huge_pages.resident_huge_bytes() or 0) - before
    print(f"1 GiB sum buffers: {gained / 2**20:.0f} MiB more in huge pages")
    best = {name: float("inf") for name in buffers}
    for _ in range(5):  # alternating, best of 5 each
        for name, x in buffers.items():
            x.sum()
            t0 = time.perf_counter()
            x.sum()
            best[name] = min(best[name], time.perf_counter() - t0)
    for name, t in best.items():
        print(f"1 GiB fp32 sum in {name}: {n * 4 / t / 1e9:.1f} GB/s")


DRAFT_SHAPES = [(896, 1152), (896, 896), (896, 9728), (4864, 896), (896, 151936)]  # the 0.5B


def draft_part(model_name: str, rounds: int) -> None:
    """A draft model's one-row int4 calls with x exact and with x rounded to int8
    (``QUANTISED_X``), alternating: per matmul of the 0.5B's shapes (weights from memory,
    best of 3), then per whole one-token step of ``model_name`` marked as a draft
    (``fused_layer.set_draft``, ``SPECSERVE_DRAFT_INT8_X`` on and off; medians), and how often
    the two steps' greedy tokens agree over the context's positions."""
    import os

    from specserve.models.native import fused_layer, int4_native
    from specserve.models.native.tile_stream import QUANTISED_X, TILES_NEVER

    if not int4_native.quantised_x():
        raise SystemExit("the int4 kernel built here has no quantised-x path (not AVX2)")
    torch.manual_seed(0)
    print("| K x N | exact us | x in int8 us | exact / int8 | int8 GB/s |")
    print("|---|---|---|---|---|")
    op = torch.ops.specserve.int4_gemm
    for k, n in DRAFT_SHAPES:
        copies = [
            int4_native.pack(_random_weight(n, k))
            for _ in range(max(1, int(100e6 // (k * n // 2))))
        ]
        x = torch.randn(1, k, dtype=torch.bfloat16)
        best = {TILES_NEVER: float("inf"), QUANTISED_X: float("inf")}
        for _ in range(3):
            for mode in best:
                call = lambda p, mode=mode, x=x: op(x, *p.op_args(1)[:-1], mode)  # noqa: E731
                best[mode] = min(best[mode], _seconds_per_call(call, copies, 0.15))
        exact, int8 = best[TILES_NEVER], best[QUANTISED_X]
        print(f"| {k} x {n} | {exact * 1e6:.0f} | {int8 * 1e6:.0f} | {exact / int8:.2f} | "
              f"{copies[0].nbytes() / int8 / 1e9:.1f} |", flush=True)  # fmt: skip
    from specserve.loading.quant_cache import load_in_format

    model = load_in_format(model_name, "int4", torch.bfloat16).model
    cache = _cache_at_200(model)
    base = cache.num_tokens

    def use(on: bool) -> None:
        os.environ["SPECSERVE_DRAFT_INT8_X"] = "1" if on else "0"
        fused_layer.set_draft(model)

    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for on in (True, False):
            use(on)
            t0 = time.perf_counter()
            model.compute_logits(cache.forward([5]))
            times[on].append(time.perf_counter() - t0)
            cache.truncate(base)
    agree = 0
    contexts = range(40, base)
    for n in contexts:  # the greedy token after each prefix, both ways
        picks = []
        for on in (True, False):
            use(on)
            cache.truncate(n - 1)
            picks.append(int(model.compute_logits(cache.forward([100 + n - 1])).argmax()))
        agree += picks[0] == picks[1]
    use(True)
    t_on, t_off = (statistics.median(times[v]) * 1e3 for v in (True, False))
    print(f"{model_name} one-token step: x in int8 {t_on:.1f} ms, exact {t_off:.1f} ms, "
          f"exact / int8 {t_off / t_on:.2f}x ({rounds} rounds, medians); greedy token the same "
          f"at {agree}/{len(contexts)} positions; {fused_layer.describe(model)}")  # fmt: skip


def _count_ops(step: Callable[[], object]) -> int:
    """Operator calls that reach the dispatcher in ``step`` (each costs a few µs in eager)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Counter.calls += 1
            return func(*args, **(kwargs or {}))

    with torch.inference_mode(), Counter():
        step()
    return Counter.calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["matmul", "step", "thp", "draft"], required=True)
    ap.add_argument(
        "--model", default="qwen2.5-coder-1.5b-instruct", help="for --part step, thp and draft"
    )
    ap.add_argument("--rounds", type=int, default=30, help="alternations of --part draft")
    args = ap.parse_args()
    if args.part == "matmul":
        matmul_part()
    elif args.part == "draft":
        draft_part(args.model, args.rounds)
    elif args.part == "thp":
        thp_part(args.model)
    else:
        step_part(args.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
