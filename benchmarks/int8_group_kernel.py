"""The native int8-group kernel beside the native int4 kernel, per matmul shape.

For two Qwen2.5-Coder-1.5B shapes, the MLP down projection (N = 1536, K = 8960) and the LM head
(N = 151936, K = 1536), the time of one ``specserve::int8_gemm`` call (group size 16, the
GGUF K-quants' sub-block) with byte codes and with six-bit codes (codes in -32 .. 31, as
Q6_K's are packed), with six-bit codes and Q6_K's superblock constants where this host packs
them (S = 256; on AVX2 hosts in quad order, on int8 activations), and of one
``specserve::int4_gemm`` call (group size 32) at
M = 1, 2, 5, 8 and 16 rows, and the weight bytes each call reads (packed codes + fp16 scales)
per second. Each timing rotates over enough weight copies (~100 MB) that reads come from
memory, not from the last-level cache, as in real decoding; best of 3.

``--part step`` times one forward of the gguf 1.5B (``--model``: another gguf model, e.g. the
0.5B draft; its Q6_K/Q5_0/Q8_0 tensors run on this kernel, its Q4_K ones on the int4 kernel)
over T = 1 .. 9 new tokens (``--max-new``) at a 200-token
context, logits included (a decode step and the verify steps of k = 1 .. 8 drafts), with
the int8 kernel's 16-lane (AVX-512F) and 8-lane (AVX2) variants alternating
(``SPECSERVE_INT8_AVX512``), with ``--switch sweep`` the two ways the int4 and int8 kernels
prefetch (``SPECSERVE_SWEEP_PREFETCH``), with ``--switch l2`` into which cache they prefetch
(``SPECSERVE_PREFETCH_L2``: L2 or L1), with ``--switch distance`` how far ahead the runs
over one tile at a time (4 or more rows) prefetch (``SPECSERVE_ONE_TILE_PREFETCH``: 6 KiB, or
the 1 / 2 KiB of the int4 / int8 kernels' other runs), with ``--switch avx2-prefetch``
whether the AVX2 int4 kernel on int8 activations prefetches its weights at all
(``SPECSERVE_AVX2_PREFETCH``), or with ``--switch layout`` the two
packings of their weights (each group's constants inline in its tile's stream, as loaded,
or apart in their own tensor: the same codes and constants), medians of ``--rounds``; the two
settings give identical logits. ``--switch amx`` alternates the int4 and six-bit matmuls on
the AMX tiles (``SPECSERVE_QUANT_AMX=1``) and on ``vdpbf16ps``, and ``--switch superblocks``
the six-bit weights with superblock constants (as loaded where the CPU runs them) and with
per-group fp16 constants (in the codes the host packs those in: bytes on AVX2, where the
superblocks take int8 activations), ``--switch int4-superblocks`` the same for the int4
weights (Q4_K's constants as stored, or per-group fp16 constants rounded from them); their sums
round differently, so these print the largest logit difference instead, as does ``--switch int8-x``:
the K-quant matmuls on int8 activations (``vpdpbusd``, the default on AVX-512 VNNI builds) and
on bf16 ones (``SPECSERVE_INT8_ACTIVATIONS=0``). ``--weights int4`` runs the step on the int4
format instead (the file re-quantised to groups of 64 with per-group fp16 constants, which take
int8 activations too).

    python benchmarks/int8_group_kernel.py
    python benchmarks/int8_group_kernel.py --rows 1 5 --shape down
    python benchmarks/int8_group_kernel.py --rows 1 --shape down --cached
    python benchmarks/int8_group_kernel.py --part step --rounds 9
    python benchmarks/int8_group_kernel.py --part step --switch sweep --rounds 25
    python benchmarks/int8_group_kernel.py --part step --switch layout --rounds 25
    python benchmarks/int8_group_kernel.py --part step --switch amx --rounds 5 \
        --model qwen2.5-coder-0.5b-instruct --max-new 16
    python benchmarks/int8_group_kernel.py --part step --switch distance --rounds 25
    python benchmarks/int8_group_kernel.py --part step --switch avx2-prefetch --rounds 15
    python benchmarks/int8_group_kernel.py --part step --switch codes --rounds 25
    python benchmarks/int8_group_kernel.py --part step --switch superblocks --rounds 15
    python benchmarks/int8_group_kernel.py --part step --switch int4-superblocks --rounds 80 \
        --max-new 2
    python benchmarks/int8_group_kernel.py --part step --switch l2 --rounds 15
    python benchmarks/int8_group_kernel.py --part step --switch amx --rounds 7
    python benchmarks/int8_group_kernel.py --part step --switch int8-x --rounds 15
    python benchmarks/int8_group_kernel.py --part step --switch int8-x --weights int4 --rounds 9

``--part breakdown`` times a whole step of the gguf 1.5B over as many tokens as the smallest
``--rows`` against its 113 matmuls alone, alternating (what the rest of a step costs):

    python benchmarks/int8_group_kernel.py --part breakdown --rows 1 --rounds 25

``--part accuracy`` compares the int8 kernels' arithmetic on the gguf 1.5B's LM head (six-bit
codes) and its own hidden states (as many rows as the largest ``--rows``) with a float64
product of the same packed codes and constants:

    python benchmarks/int8_group_kernel.py --part accuracy --rows 32

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
    """Random codes with group scales and offsets (the shape of an Int8GroupWeight): bytes in
    -128 .. 127, or with ``six_bit`` in -32 .. 31 (packed in six bits, as Q6_K's are); with
    ``k_quant`` Q6_K's constants instead (an fp16 scale per 256 inputs times int8 codes per 16,
    no offsets: they have the superblock form)."""

    def __init__(
        self, n: int, k: int, gen: torch.Generator, six_bit: bool = False, k_quant: bool = False
    ) -> None:
        self.group_size = INT8_GROUP
        self.codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
        if six_bit or k_quant:
            self.codes >>= 2
        self.scale = torch.rand(n, k // INT8_GROUP, generator=gen) * 1e-3 + 1e-4
        self.offset = torch.randn(n, k // INT8_GROUP, generator=gen) * 1e-3
        if k_quant:
            d = (torch.rand(n, k // 256, generator=gen) * 1e-3 + 1e-5).half().float()
            sc = torch.randint(-128, 128, (n, k // INT8_GROUP), generator=gen).float()
            self.scale = d.repeat_interleave(256 // INT8_GROUP, dim=1) * sc
            self.offset = torch.zeros_like(self.scale)


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


def run(shapes: list[str], rows: list[int], budget_s: float, with_int4: bool, cached: bool) -> None:
    from specserve.models.native import int4_native, int8_native, superblock

    if not int8_native.available():
        raise SystemExit(
            f"native int8-group kernel unavailable: {int8_native.unavailable_reason()}"
        )
    with_int4 = with_int4 and int4_native.available()
    gen = torch.Generator().manual_seed(0)
    print(f"threads: {torch.get_num_threads()}")
    supers = superblock.preferred()  # Q6_K-like weights with superblock constants run here
    print(
        "| shape | N x K | M | int8 G=16 ms | int8 GB/s | six-bit G=16 ms | six-bit GB/s "
        "| six-bit S=256 ms | six-bit S=256 GB/s | int4 G=32 ms | int4 GB/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in shapes:
        n, k = SHAPES[name]
        copies = 1 if cached else max(1, int(ROTATE_BYTES // (n * k)))
        int8_packed = [int8_native.pack(_Weight(n, k, gen)) for _ in range(copies)]
        six_copies = 1 if cached else max(1, int(ROTATE_BYTES // (n * k * 3 // 4)))
        six_packed = [
            int8_native.pack(_Weight(n, k, gen, True), code_bits=6) for _ in range(six_copies)
        ]
        super_packed = []
        if supers:  # as many copies as the six-bit ones: about the same bytes
            super_packed = [
                int8_native.pack(_Weight(n, k, gen, k_quant=True), superblocks=True)
                for _ in range(six_copies)
            ]
        int4_packed = []
        if with_int4:
            int4_copies = 1 if cached else max(1, int(ROTATE_BYTES // (n * k // 2)))
            int4_packed = [int4_native.pack(_int4_weight(n, k, gen)) for _ in range(int4_copies)]
        for m in rows:
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
            t8 = _best(lambda p, x=x: int8_native.matmul(x, p), int8_packed, budget_s)
            gb8 = int8_packed[0].nbytes() / t8 / 1e9
            t6 = _best(lambda p, x=x: int8_native.matmul(x, p), six_packed, budget_s)
            six_cols = f"{t6 * 1e3:.3f} | {six_packed[0].nbytes() / t6 / 1e9:.1f}"
            super_cols = "- | -"
            if super_packed:
                ts = _best(lambda p, x=x: int8_native.matmul(x, p), super_packed, budget_s)
                super_cols = f"{ts * 1e3:.3f} | {super_packed[0].nbytes() / ts / 1e9:.1f}"
            int4_cols = "- | -"
            if int4_packed:
                t4 = _best(lambda p, x=x: int4_native.matmul(x, p), int4_packed, budget_s)
                int4_cols = f"{t4 * 1e3:.3f} | {int4_packed[0].nbytes() / t4 / 1e9:.1f}"
            print(
                f"| {name} | {n} x {k} | {m} | {t8 * 1e3:.3f} | {gb8:.1f} | {six_cols} "
                f"| {super_cols} | {int4_cols} |",
                flush=True,
            )
        del int8_packed, six_packed, super_packed, int4_packed


# --part step's switches: what is switched (an environment variable, or "layout": the packed
# weights), then the labels of its "1" and "0" settings.
SWITCHES = {
    "lanes": ("SPECSERVE_INT8_AVX512", "16 lanes", "8 lanes"),
    "sweep": ("SPECSERVE_SWEEP_PREFETCH", "sweep prefetch", "per-tile prefetch"),
    "layout": ("layout", "constants inline", "constants apart"),
    "codes": ("codes", "six-bit codes", "byte codes"),
    "superblocks": ("superblocks", "superblock constants", "per-group fp16 constants"),
    "int4-superblocks": ("int4-superblocks", "Q4_K superblock constants", "per-group fp16"),
    "amx": ("SPECSERVE_QUANT_AMX", "AMX tiles", "AVX-512 BF16"),
    "l2": ("SPECSERVE_PREFETCH_L2", "prefetch into L2", "prefetch into L1"),
    "distance": (
        "SPECSERVE_ONE_TILE_PREFETCH",
        "one-tile runs 6 KiB ahead",
        "as far as the others",
    ),
    "int8-x": ("SPECSERVE_INT8_ACTIVATIONS", "int8 activations", "bf16 activations"),
    "avx2-prefetch": ("SPECSERVE_AVX2_PREFETCH", "int4 x8 prefetch", "no int4 x8 prefetch"),
}


# settings whose sums round differently: the step prints how far apart their logits are
ROUNDING_SWITCHES = (
    "SPECSERVE_QUANT_AMX",
    "SPECSERVE_INT8_ACTIVATIONS",
    "superblocks",
    "int4-superblocks",
)


def _byte_codes(p):  # type: ignore[no-untyped-def]  # an Int8Packed
    """A six-bit packed weight again with byte codes, constants inline (other weights as
    they are): the same codes and constants."""
    from specserve.models.native import tile_stream

    if getattr(p, "code_bits", 8) == 8:
        return p
    p = _per_group(p)
    tiles, ngroups, gs = p.qweight.shape[0], p.qweight.shape[1], p.group_size
    qweight, scales, codes, constants = tile_stream.allocate(
        tiles, p.in_features, gs, 4, torch.int8, True
    )
    codes.copy_(p.code_blocks().view(tiles, ngroups, gs // 4, 64))
    constants.copy_(p.constants())
    return type(p)(qweight, scales, p.row_scale, p.out_features, gs)


def _per_group(p):  # type: ignore[no-untyped-def]  # an Int8Packed
    """A weight with superblock constants again with per-group fp16 constants, in the codes
    this host packs those in (six-bit where they run as bf16 pairs, else bytes: what it loads
    without superblock constants; other weights as they are): the same codes and weights."""
    from specserve.models.native import int8_native, superblock
    from specserve.models.quant.int8_group import Int8GroupWeight

    if not getattr(p, "superblock_form", 0):
        return p
    codes, scale, offset = superblock.unpack(p.qweight, p.out_features, p.group_size)
    weight = Int8GroupWeight(codes, scale, offset, 16)
    return int8_native.pack(weight, superblocks=False)


def _int4_per_group(p):  # type: ignore[no-untyped-def]  # an Int4Packed or Int8Packed
    """An int4 weight with superblock constants again with per-group fp16 constants (other
    weights as they are): the same codes and weights."""
    from specserve.models.native import int4_native, int4_superblock
    from specserve.models.quant.int4_weight import Int4Weight, pack_nibbles

    if not getattr(p, "superblock_constants", False):
        return p
    codes, scale, minimum = int4_superblock.unpack(p.qweight, p.out_features)
    weight = Int4Weight(pack_nibbles(codes), scale, minimum, int4_superblock.GROUP)
    packed = int4_native.pack(weight)
    packed.exact_x = True  # as the file's per-group blocks: bf16 x
    return packed


def _apart(p):  # type: ignore[no-untyped-def]  # an Int4Packed or Int8Packed
    """``p`` with its constants apart (byte codes): the same codes and constants."""
    return type(p)(
        p.code_blocks(), p.constants().contiguous(), p.row_scale, p.out_features, p.group_size
    )


def _layout_setter(model: torch.nn.Module, switch: str) -> Callable[[str], None]:
    """Packs every native projection of ``model`` (the fused layers' and the LM head's) a
    second time, from the same codes and constants: with the constants apart (``layout``) or
    with byte codes where they are six-bit (``codes``); the returned function puts the model on
    the packing as loaded ("1") or the other one ("0")."""
    from specserve.models.native import fused_layer
    from specserve.models.quant.int8_group import Int8GroupLinear
    from specserve.models.quant.layers import Int4Linear

    linears = [
        m
        for m in model.modules()
        if isinstance(m, Int4Linear | Int8GroupLinear) and m.native is not None
    ]
    if not linears or not all(m.native.inline_constants for m in linears):
        raise SystemExit(f"--switch {switch} needs the native kernels with inline constants")
    if switch == "codes" and not any(getattr(m.native, "code_bits", 8) == 6 for m in linears):
        raise SystemExit("--switch codes: no projection has six-bit codes")
    superblocks = [getattr(m.native, "superblock_form", 0) for m in linears]
    if switch == "superblocks" and not any(superblocks):
        raise SystemExit("--switch superblocks: no projection has superblock constants")
    if switch == "int4-superblocks" and not any(
        getattr(m.native, "superblock_constants", False) for m in linears
    ):
        raise SystemExit("--switch int4-superblocks: no int4 projection has superblock constants")
    repack = {
        "layout": _apart,
        "codes": _byte_codes,
        "superblocks": _per_group,
        "int4-superblocks": _int4_per_group,
    }[switch]
    packs: dict[str, list[object]] = {
        "1": [m.native for m in linears],
        "0": [repack(m.native) for m in linears],
    }
    layers = list(model.model.layers)
    fused: dict[str, list[object]] = {"1": [layer.fused for layer in layers]}
    for m, split in zip(linears, packs["0"], strict=True):
        m.native = split
    if not fused_layer.enable(model):
        raise SystemExit(f"--switch {switch}: the fused layers do not take the other packing")
    fused["0"] = [layer.fused for layer in layers]

    def put(setting: str) -> None:
        for m, packed in zip(linears, packs[setting], strict=True):
            m.native = packed
        for layer, weights in zip(layers, fused[setting], strict=True):
            layer.fused = weights

    put("1")
    return put


def part_step(rounds: int, switch: str, model_name: str, max_new: int, weights: str) -> None:
    import os
    import statistics

    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.loading.quant_cache import load_in_format

    env, on_label, off_label = SWITCHES[switch]
    model = load_in_format(model_name, weights, torch.bfloat16).model
    packing = env in ("layout", "codes", "superblocks", "int4-superblocks")
    put = _layout_setter(model, env) if packing else lambda v: os.environ.__setitem__(env, v)
    context = [(13 * i + 7) % 1000 + 100 for i in range(200)]
    new = [311, 42, 977, 5, 1234, 88, 2048, 17, 640]
    new += [(97 * i + 3) % 3000 + 30 for i in range(max_new - len(new))]
    new = new[:max_new]
    cache = SingleSequenceCache(model, len(context) + len(new))
    cache.forward(context)

    def step(setting: str, t: int) -> tuple[float, torch.Tensor]:
        put(setting)
        cache.truncate(len(context))
        t0 = time.perf_counter()
        logits = model.compute_logits(cache.forward(new[:t]))
        return time.perf_counter() - t0, logits

    sizes = range(1, len(new) + 1)
    times: dict[tuple[str, int], list[float]] = {(v, t): [] for v in ("1", "0") for t in sizes}
    for _ in range(rounds):
        for t in sizes:
            for setting in ("1", "0"):
                times[(setting, t)].append(step(setting, t)[0])
    pairs = [(step("1", t)[1], step("0", t)[1]) for t in sizes]
    same = all(torch.equal(a, b) for a, b in pairs)
    # the AMX tiles (and superblock constants) round their sums differently: how far apart
    # the logits are instead
    apart = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    if packing:
        put("1")
    else:
        os.environ.pop(env)
    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    # each round's two steps ran back to back: the median of their ratios drifts less with the
    # host than the ratio of the medians
    ratio = {
        t: statistics.median(a / b for a, b in zip(times[("0", t)], times[("1", t)], strict=True))
        for t in sizes
    }
    print(f"| {env} | " + " | ".join(f"T = {t} ms" for t in sizes) + " | T = 5 / T = 1 |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for setting, label in (("1", on_label), ("0", off_label)):
        cells = " | ".join(f"{med[(setting, t)]:.1f}" for t in sizes)
        five = med[(setting, 5)] / med[(setting, 1)] if max_new >= 5 else float("nan")
        print(f"| {label} | {cells} | {five:.2f} |")
    print(
        f"{off_label} / {on_label}, median of the rounds' ratios, at T = "
        + ", ".join(f"{t}: {ratio[t]:.2f}" for t in sizes)
        + (
            f"; identical logits: {'yes' if same else 'NO'}"
            if env not in ROUNDING_SWITCHES
            else f"; largest logit difference {apart:.3g}"
        )
        + f" ({rounds} rounds)"
    )


def part_accuracy(rows: int) -> None:
    """The gguf 1.5B's LM head (Q6_K, six-bit codes) on ``rows`` of its own final hidden
    states: each int8 kernel's fp32 outputs against a float64 product of the packed codes and
    constants, so only the kernels' arithmetic differs (the bf16-pair kernel where the CPU has
    it, the 16- and 8-lane fp32 kernels, which give the byte codes' bits)."""
    import os

    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.loading.quant_cache import load_in_format
    from specserve.models.native import int8_native, six_bit

    model = load_in_format("qwen2.5-coder-1.5b-instruct", "gguf", torch.bfloat16).model
    packed = model.lm_head.native
    if packed is None or packed.code_bits != 6:
        raise SystemExit("--part accuracy: the LM head is not on the kernel with six-bit codes")
    cache = SingleSequenceCache(model, 256)
    hidden = cache.forward([(13 * i + 7) % 1000 + 100 for i in range(rows)])
    x = model.model.norm(hidden).float()  # bf16 values, as the kernels take them
    tiles, k, gs = packed.qweight.shape[0], packed.in_features, packed.group_size
    blocks = packed.code_blocks().view(tiles, k // 4, 2, 4, 8)  # [T, B, h, c, r]
    codes = blocks.permute(0, 2, 4, 1, 3).reshape(tiles * 16, k).double()
    const = packed.constants().double() * packed.row_scale.double().view(tiles, 1, 1, 16)
    scale = const[:, :, 0].permute(0, 2, 1).reshape(tiles * 16, k // gs)
    offset = const[:, :, 1].permute(0, 2, 1).reshape(tiles * 16, k // gs)
    w = codes.view(-1, k // gs, gs) * scale[..., None] + offset[..., None]
    ref = x.double() @ w.view(-1, k)[: packed.out_features].T
    print(f"LM head {packed.out_features} x {k}, six-bit codes, {rows} rows of its hidden states")
    print("| kernel | relative error (norm) | largest abs error | mean error (bias) |")
    print("|---|---|---|---|")
    for lanes in ("1", "0"):
        os.environ["SPECSERVE_INT8_AVX512"] = lanes
        if six_bit.dot_products():
            label = "bf16 pairs (vdpbf16ps)"
        else:
            label = "fp32, 16 lanes" if lanes == "1" else "fp32, 8 lanes (= byte codes)"
        err = int8_native.matmul(x, packed).double() - ref
        print(
            f"| {label} | {float(err.norm() / ref.norm()):.2e} | {float(err.abs().max()):.2e} "
            f"| {float(err.mean()):.1e} |"
        )
    os.environ.pop("SPECSERVE_INT8_AVX512")


def part_breakdown(rounds: int, tokens: int) -> None:
    """Where a step of the gguf 1.5B goes: the whole forward over ``tokens`` new tokens at a
    200-token context with its logits, against its 113 matmuls alone (each layer's qkv, o,
    gate_up and down, then the LM head, on the same packed weights in the same order, through
    the ops directly), alternating; the rest of a step (attention, norms, the residual adds,
    the embedding row, the hand-offs between ops) is the difference."""
    import statistics

    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.loading.quant_cache import load_in_format
    from specserve.models.quant.int8_group import Int8GroupLinear

    model = load_in_format("qwen2.5-coder-1.5b-instruct", "gguf", torch.bfloat16).model
    linears = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
    linears.append(model.lm_head)
    calls = []
    for m in linears:
        p = m.native
        op = torch.ops.specserve.int8_gemm if isinstance(m, Int8GroupLinear) else None
        op = op or torch.ops.specserve.int4_gemm
        x = torch.randn(tokens, p.in_features).to(torch.bfloat16)
        calls.append((op, x, (p.qweight, p.scales, p.row_scale, p.out_features, p.group_size)))
    weight_bytes = sum(m.native.nbytes() for m in linears)
    context = [(13 * i + 7) % 1000 + 100 for i in range(200)]
    new = [311, 42, 977, 5, 1234, 88, 2048, 17, 640][:tokens]
    cache = SingleSequenceCache(model, 256)
    cache.forward(context)

    def step() -> float:
        cache.truncate(len(context))
        t0 = time.perf_counter()
        model.compute_logits(cache.forward(new))
        return time.perf_counter() - t0

    def matmuls() -> float:
        t0 = time.perf_counter()
        for op, x, args in calls:
            op(x, *args)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {"step": [], "matmuls": []}
    for _ in range(rounds):
        times["step"].append(step())
        times["matmuls"].append(matmuls())
    med = {key: statistics.median(v) for key, v in times.items()}
    share = statistics.median(b / a for a, b in zip(times["step"], times["matmuls"], strict=True))
    print(f"gguf 1.5B, {tokens} new token(s), {len(calls)} matmuls, {weight_bytes / 1e9:.3f} GB")
    print("| part | ms (median) | GB/s of the weights |")
    print("|---|---|---|")
    for key in ("step", "matmuls"):
        print(f"| {key} | {med[key] * 1e3:.1f} | {weight_bytes / med[key] / 1e9:.1f} |")
    print(f"matmuls / step, median of the rounds' ratios: {share:.2f} ({rounds} rounds)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["matmul", "step", "accuracy", "breakdown"], default="matmul")
    ap.add_argument("--rounds", type=int, default=9, help="--part step: rounds (medians)")
    ap.add_argument(
        "--switch",
        choices=list(SWITCHES),
        default="lanes",
        help="--part step: what alternates (the int8 kernel's vector width, how the int4 "
        "and int8 kernels prefetch, where their packed weights keep the group constants, or "
        "the int8 kernel's six-bit or byte codes)",
    )
    ap.add_argument(
        "--model", default="qwen2.5-coder-1.5b-instruct", help="--part step: the gguf model"
    )
    ap.add_argument(
        "--max-new", type=int, default=9, help="--part step: T = 1 .. this many new tokens"
    )
    ap.add_argument(
        "--weights",
        choices=["gguf", "int4"],
        default="gguf",
        help="--part step: the model's weight format (int4: the int4 format's groups of 64, "
        "re-quantised from the file; only --switch int8-x, amx, sweep, l2, distance and "
        "avx2-prefetch apply)",
    )
    ap.add_argument("--shape", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 5, 8, 16], help="values of M")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per timing round")
    ap.add_argument("--no-int4", action="store_true", help="time the int8-group kernel only")
    ap.add_argument(
        "--cached",
        action="store_true",
        help="one weight copy, read again and again: from the cache where it fits (the down "
        "shape's int4 copy is 7 MB), which shows what the kernels compute when memory is not "
        "the limit",
    )
    args = ap.parse_args()
    if args.part == "step":
        if args.max_new < 1:
            ap.error(f"--max-new must be >= 1, got {args.max_new}")
        part_step(args.rounds, args.switch, args.model, args.max_new, args.weights)
        return 0
    if args.part == "accuracy":
        part_accuracy(max(args.rows))
        return 0
    if args.part == "breakdown":
        part_breakdown(args.rounds, min(args.rows))
        return 0
    run(args.shape, args.rows, args.budget, not args.no_int4, args.cached)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
