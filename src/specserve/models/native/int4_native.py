"""Native CPU kernel for int4 weight-only matmuls (AVX-512 BF16 or AVX2), built on first use.

``y = x @ w.T`` with bf16 (or fp32) activations ``x # [M, K]`` and the group-quantised weights
of :class:`~specserve.models.quant.int4_weight.Int4Weight` (``w[n, k] = q[n, k] * scale[n, g] +
minimum[n, g]``, ``g = k // group_size``). On AVX-512 BF16 CPUs the activations are not
quantised: the kernel turns each code into the bf16 number ``128 + q`` (bit pattern
``0x4300 | q``), multiplies it with ``x`` exactly (``vdpbf16ps``), sums in fp32 and folds the
offset into the group's bias: with the midpoint ``c = minimum + 7.5·scale``,
``y = Σ_g scale·dot(128 + q, x) + (c − 135.5·scale)·Σ_g x``. On AVX2 CPUs each row's group of
bf16 inputs is written as 16-bit integers times a power of two ``dx`` (the group's largest
input lies in [2^14, 2^15)·dx, so every input within 2^7 of it is exact and the others are off
by at most 2^-16 of it), and ``dot(q, xq)`` is an exact integer sum (``vpmaddwd``):
``y = Σ_g scale·dx·dot(q, xq) + (c − 7.5·scale)·Σ_g x``. Both are exact up to fp32 rounding
(and on AVX2 that last bit of the small inputs). ``scale`` and ``c`` are stored as fp16
(after a per-row power-of-two normalisation), which costs ~2e-4 relative error on the
outputs, well under the bf16 rounding of the result (the torch int4 kernel keeps bf16 scales:
~8x coarser). Groups of a multiple of 32 take int8 activations instead by default, on
AVX-512 VNNI and on AVX2 (:func:`int8_activations`: x rounded per 32 inputs to
``max |x| / 127`` steps).

Batch invariance: every output ``(m, n)`` runs the same operations in the same order
whatever ``M`` is, whatever the other rows hold and however the threads split the work (they
split the output columns only, with torch's intra-op pool), so a ``k + 1``-row verify gives bit
for bit what a 1-row decode gives.

Usage::

    if int4_native.available():
        packed = int4_native.pack(weight)  # once, at load; Int4Packed's tensors are buffers
        y = int4_native.matmul(x, packed)  # [..., N]

Build: ``build.py`` compiles ``csrc/int4_gemv.cpp`` and ``csrc/decoder_layer.cpp`` into one
cached library on first use. The ops are ``torch.ops.specserve.int4_gemm`` and
``torch.ops.specserve.int4_decoder_layer`` (see fused_layer.py).
:func:`available` is False (the reason logged once, see :func:`unavailable_reason`) when
``SPECSERVE_INT4_NATIVE=0``, on a CPU without AVX2 / FMA / F16C, or when the build or a
self-test fails; callers then fall back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

import torch

from specserve.models.native import build, tile_stream
from specserve.models.native.availability import Availability
from specserve.models.quant.int4_weight import Int4Weight

logger = logging.getLogger(__name__)

__all__ = [
    "TILE_ROWS",
    "Int4Packed",
    "available",
    "matmul",
    "pack",
    "unavailable_reason",
]

TILE_ROWS = tile_stream.TILE_ROWS  # output rows per tile: one per fp32 lane of a zmm register
BLOCK_K = 8  # input channels per 64-byte block of a tile
# Superblock constants (int4_superblock.py): inputs a superblock, inputs a sub-group (the
# weight's group_size), and per tile and superblock the header blocks and all the blocks.
SUPERBLOCK, SUPER_GROUP = 256, 32
SUPER_HEADER_BLOCKS = 4
SUPER_BLOCKS = SUPER_HEADER_BLOCKS + SUPERBLOCK // BLOCK_K
_PACK_ROW_CHUNK = 4096  # rows packed at a time (bounds the temporaries of an LM head)
X8_GROUP = 32  # inputs sharing one int8 step where activations are int8 (int8_activations)
_ENV_SWITCH = "SPECSERVE_INT4_NATIVE"


# ---------------------------------------------------------------- packed weights ------------


@dataclass
class Int4Packed(tile_stream.PackedTiles):
    """An :class:`Int4Weight` in the native kernel's layout (plain CPU tensors: module buffers).

    With ``Np = N`` rounded up to a multiple of 16 (padding rows are zero and never written
    out), ``K`` the input features and ``G`` the group size:

    Attributes:
        qweight: ``# [Np / 16, K / 8 + K / G, 64] uint8`` (constants inline, what
            :func:`pack` writes) or ``# [Np / 16, K / 8, 64]`` (constants apart). One 64-byte
            block per tile of 16 output rows and 8 input channels ``k0 .. k0 + 7``; a tile's
            blocks follow each other along K, so a tile is one contiguous stream. Byte
            ``L*16 + h*8 + 2t + e`` (``L, t`` in 0..3, ``h, e`` in 0..1) belongs to row
            ``4L + t`` of the tile: its low nibble is ``q[row, k0 + 2h + e]``, its high nibble
            ``q[row, k0 + 4 + 2h + e]``. Split into low / high nibbles and interleaved
            bytewise with ``0x43``, the block becomes four vectors of bf16 pairs
            ``(128 + q[i, k0 + 2c], 128 + q[i, k0 + 2c + 1])``, 32-bit lane ``i`` = row ``i``:
            the operands of ``vdpbf16ps``. With the constants inline, each group's ``G / 8``
            code blocks are followed by one more block holding the group's constants (the
            ``[2, 16]`` fp16 of ``scales`` below), so a 1-row matmul reads one stream per tile
            instead of two: decode steps of the gguf 1.5B were faster that way
            (docs/benchmarks.md).
        scales: ``# [Np / 16, K / G, 2, 16] fp16`` (constants apart; empty when inline): per
            tile and group the 16 rows' scales ``s``, then their midpoints
            ``c = minimum + 7.5·s`` (so ``w = (q − 7.5)·s + c``; ``c`` is small for centred
            groups and its fp16 rounding cheap), each divided by the row's ``row_scale``.
        row_scale: ``# [Np] fp32``: a power of two per row, at least the row's largest
            ``|s|`` / ``|c|`` (1 for all-zero and padding rows), so the fp16 values lie in
            [-1, 1] whatever the weights' magnitude; the kernel multiplies it back.
        out_features: ``N`` (the kernel writes exactly ``N`` columns).
        group_size: ``G`` (a multiple of 8 dividing ``K``).
        in_features: ``K`` (derived from ``qweight``).
        inline_constants: whether the constants are inline (``scales`` is empty).
    """

    BLOCK_K: ClassVar[int] = BLOCK_K
    CODE_DTYPE: ClassVar[torch.dtype] = torch.uint8

    def _layout_k(self) -> tuple[int, bool]:
        """As :meth:`PackedTiles._layout_k`, and a four-dimensional ``qweight`` is the layout
        with superblock constants (:mod:`~specserve.models.native.int4_superblock`:
        ``# [Np / 16, K / 256, 36, 64] uint8``, group size 32, the constants inline)."""
        q = self.qweight
        if q.dim() != 4:
            return super()._layout_k()
        if q.dtype != torch.uint8 or q.shape[2:] != (SUPER_BLOCKS, 64):
            raise ValueError(
                f"int4 qweight with superblock constants must be uint8 [Np/16, K/256, "
                f"{SUPER_BLOCKS}, 64], got {q.dtype} {tuple(q.shape)}"
            )
        if self.group_size != SUPER_GROUP:
            raise ValueError(f"superblock constants need group_size 32, got {self.group_size}")
        if self.scales.numel() or self.scales.dtype != torch.float16:
            raise ValueError("superblock constants are inline: scales must be empty fp16")
        return q.shape[1] * SUPERBLOCK, True

    @property
    def superblock_constants(self) -> bool:
        """Whether the constants are per superblock (int4_superblock.py), not per group."""
        return self.qweight.dim() == 4

    def code_blocks(self) -> torch.Tensor:
        """As :meth:`PackedTiles.code_blocks` (superblock constants: a copy without them)."""
        if not self.superblock_constants:
            return super().code_blocks()
        blocks = self.qweight[:, :, SUPER_HEADER_BLOCKS:]
        return blocks.reshape(self.qweight.shape[0], -1, 64)

    def constants(self) -> torch.Tensor:
        """As :meth:`PackedTiles.constants`; superblock constants have no such form."""
        if self.superblock_constants:
            raise ValueError("superblock constants have no per-group fp16 form")
        return super().constants()


def pack_code_blocks(codes: torch.Tensor) -> torch.Tensor:
    """``codes # [n, K] uint8`` (``n`` a multiple of 16) -> ``# [n / 16, K / 8, 64] uint8``."""
    n, k = codes.shape
    # k = 8B + 4·nib + 2h + e and row = 4L + t  ->  byte (L, h, t, e) of block B, nibble nib.
    v = codes.view(n // TILE_ROWS, 4, 4, k // BLOCK_K, 2, 2, 2)  # [T, L, t, B, nib, h, e]
    v = v.permute(0, 3, 1, 5, 2, 6, 4)  # [T, B, L, h, t, e, nib]
    return (v[..., 0] | (v[..., 1] << 4)).reshape(n // TILE_ROWS, k // BLOCK_K, 64)


def unpack_code_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_code_blocks`: ``# [T, K / 8, 64] uint8`` -> the codes
    ``# [16 T, K] uint8``."""
    tiles, nblocks = blocks.shape[:2]
    v = blocks.view(tiles, nblocks, 4, 2, 4, 2)  # [T, B, L, h, t, e]
    v = torch.stack([v & 0xF, v >> 4], dim=-1)  # [T, B, L, h, t, e, nib]
    v = v.permute(0, 2, 4, 1, 6, 3, 5)  # [T, L, t, B, nib, h, e]
    return v.reshape(tiles * TILE_ROWS, nblocks * BLOCK_K)


def pack(weight: Int4Weight, *, inline_constants: bool = True) -> Int4Packed:
    """Repack ``weight`` for :func:`matmul` (a row chunk at a time: no big temporaries),
    with each group's constants inline in its tile's stream (the default) or apart in
    ``scales`` (``inline_constants=False``: the earlier layout, kept for A/B benchmarks;
    both give bit-identical matmuls).

    Raises:
        ValueError: ``group_size`` is not a multiple of 8, or the scales are not finite.
    """
    n, half_k = weight.nibbles.shape
    k, gs = 2 * half_k, weight.group_size
    if gs % BLOCK_K or k % gs:
        raise ValueError(
            f"the int4 kernel needs a group_size that is a multiple of 8 dividing K={k}, got {gs}"
        )
    if weight.nibbles.dtype != torch.uint8:
        raise ValueError(f"nibbles must be uint8, got {weight.nibbles.dtype}")
    if weight.minimum.shape != weight.scale.shape:
        raise ValueError("int4 minimum and scale shapes differ")
    tiles = -(-n // TILE_ROWS)
    # Streamed once per token: huge pages where the host allows (models/native/huge_pages.py).
    qweight, scales, code_view, const_view = tile_stream.allocate(
        tiles, k, gs, BLOCK_K, torch.uint8, inline_constants
    )
    ngroups, bpg = k // gs, gs // BLOCK_K
    row_scale = torch.ones(tiles * TILE_ROWS, dtype=torch.float32)
    for start in range(0, n, _PACK_ROW_CHUNK):  # a multiple of 16: chunks are whole tiles
        stop = min(n, start + _PACK_ROW_CHUNK)
        rows, t0 = stop - start, start // TILE_ROWS
        pad = -rows % TILE_ROWS
        nib = weight.nibbles[start:stop].cpu()
        codes = torch.stack([nib & 0xF, nib >> 4], dim=-1).view(rows, k)
        s = weight.scale[start:stop].detach().cpu().float()
        mn = weight.minimum[start:stop].detach().cpu().float()
        if pad:
            codes = torch.nn.functional.pad(codes, (0, 0, 0, pad))
            s = torch.nn.functional.pad(s, (0, 0, 0, pad))
            mn = torch.nn.functional.pad(mn, (0, 0, 0, pad))
        if not (torch.isfinite(s).all() and torch.isfinite(mn).all()):
            raise ValueError("int4 scales / minimums must be finite")
        t1 = t0 + (rows + pad) // TILE_ROWS
        code_view[t0:t1] = pack_code_blocks(codes).view(t1 - t0, ngroups, bpg, 64)
        mid = mn + 7.5 * s  # the group's midpoint
        const_view[t0:t1], row_scale[t0 * TILE_ROWS : t1 * TILE_ROWS] = tile_constants(s, mid)
    return Int4Packed(qweight, scales, row_scale, n, gs)


def tile_constants(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two per-group constants ``a``, ``b # [r, K/G]`` (``r`` a multiple of 16) in the
    kernels' tile layout: ``# [r / 16, K/G, 2, 16] fp16`` (per tile and group the 16 rows'
    ``a``, then their ``b``), each divided by its row's power-of-two scale ``# [r] fp32`` (at
    least the row's largest ``|a|`` / ``|b|``; 1 for all-zero rows), returned second."""
    peak = torch.maximum(a.abs().amax(dim=1), b.abs().amax(dim=1))
    exp = torch.frexp(peak).exponent  # peak = mantissa · 2^exp, mantissa in [0.5, 1)
    rs = torch.where(peak > 0, torch.ldexp(torch.ones_like(peak), exp), torch.ones_like(peak))
    pair = torch.stack([a / rs[:, None], b / rs[:, None]], dim=0)  # [2, r, K/G]
    pair = pair.view(2, a.shape[0] // TILE_ROWS, TILE_ROWS, a.shape[1]).permute(1, 3, 0, 2)
    return pair.to(torch.float16), rs


# ---------------------------------------------------------------- matmul --------------------


def matmul(x: torch.Tensor, packed: Int4Packed) -> torch.Tensor:
    """``x # [..., K]`` (bf16 or fp32, CPU) @ the packed weight ``.T`` -> ``# [..., N]``
    (``PackedTiles.matmul``: fp32 inputs rounded to bf16, the result in ``x``'s dtype).
    Call only after :func:`available` returned True: this checks that the kernel is loaded,
    not ``SPECSERVE_INT4_NATIVE`` (that switch is for the callers' setup).

    Raises:
        ValueError: wrong dtype, device or last dimension of ``x``.
        RuntimeError: the kernel is not loaded.
    """
    return packed.matmul(x, torch.ops.specserve.int4_gemm, _kernel)


# ---------------------------------------------------------------- load ----------------------


def _load() -> str | None:
    """Build (or reuse) and load the kernel; None on success, else why not."""
    return build.load_library() or _self_test()


def _self_test() -> str | None:
    """Run the kernel once on a small random weight against a float64 reference (catches a
    CPU without the ISA, which the op reports, and a miscompiled kernel)."""
    gen = torch.Generator().manual_seed(0)
    n, k, gs = 37, 128, 32
    weight = Int4Weight(
        torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen),
        torch.rand(n, k // gs, generator=gen) + 0.5,
        -torch.rand(n, k // gs, generator=gen) * 8,
        gs,
    )
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    packed = pack(weight)
    try:
        y = torch.ops.specserve.int4_gemm(x, packed.qweight, packed.scales, packed.row_scale, n, gs)
    except Exception as exc:  # the op refuses this CPU
        return f"self-test failed: {type(exc).__name__}: {exc}"
    ref = x.double() @ weight.dequantize(torch.float64).T
    err = float((y.double() - ref).norm() / ref.norm())
    if not err < 1e-2:
        return f"self-test failed: relative error {err:.3g} against the reference"
    return None


_kernel = Availability("int4", _ENV_SWITCH, lambda: _load(), logger)


def available() -> bool:
    """Whether :func:`matmul` can run here (builds / loads the library on the first call).

    False when ``SPECSERVE_INT4_NATIVE=0`` (checked on every call), or after a failed build /
    an unsupported CPU (decided once per process, the reason logged once).
    """
    return _kernel.available()


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True or was never asked)."""
    return _kernel.unavailable_reason()


def quantised_x() -> bool:
    """Whether one-row int4 matmuls of a weight with ``quantised_x`` (a draft model's,
    ``fused_layer.set_draft``) round x to int8 per group and multiply integer codes
    (``csrc/int4_gemv.cpp``: the AVX2 variant, where decoding the codes to fp32 costs more than
    reading them), also where the weight's other calls take int8 activations
    (:func:`int8_activations`: there rounded per 32 inputs, a path slower at one row). The
    outputs differ from the exact kernel's by about 0.6 %, which moves a draft's proposals,
    never the target's tokens. False where the kernel is not available or has no such
    one-row path (the AVX-512 variant: there all of a weight's calls take int8 activations or
    none)."""
    return available() and bool(torch.ops.specserve.int4_quantised_x())


def int8_activations() -> bool:
    """Whether weights with superblock constants (the K-quants: Q4_K here,
    :mod:`int4_superblock`; Q6_K on the int8-group kernel, :mod:`superblock`) and int4 weights
    with per-group constants in groups of a multiple of 32 (the int4 format) multiply int8
    activations now: each row's inputs rounded per 32 to ``max |x| / 127`` steps (llama.cpp's
    Q8_0 rounding) and summed against the codes centred on 8 in int32 (``vpdpbusd``,
    ``csrc/int8_x.h``), the offsets' term (8 scales included) on the exact sums of x. A verify
    of 3-9 rows costs about 1.3-1.4x less than on bf16 activations with ``vdpbf16ps`` for the
    gguf 1.5B, about 2x less for the int4 format's (docs/benchmarks.md). The default where the
    library was built with AVX-512 VNNI, and on AVX2 for int4 groups (``vpmaddubsw`` on the
    same rounding of x; there a GGUF file's Q4_K tensors are packed per group and take it
    too, and its Q6_K tensors are packed with superblock constants in quad order for it,
    :func:`superblock.quad_order`); ``SPECSERVE_INT8_ACTIVATIONS=0`` keeps bf16 activations
    (on AVX2 the int16 form above; read on every call, but read at load for the AVX2 Q6_K
    form, which once packed always takes int8 activations). A row's outputs are the same
    whatever the batch either way, but differ between the two. False where the kernel is not
    available."""
    return available() and bool(torch.ops.specserve.int4_int8_activations())


def int8_activation_kind(model: torch.nn.Module) -> str | None:
    """Which of ``model``'s matmuls multiply int8 activations now (:func:`int8_activations`),
    in words: ``"K-quants"`` for weights with superblock constants (int4's
    ``superblock_constants``, int8-group's ``superblock_form``), else ``"int4 groups"`` for
    int4 weights with per-group constants in groups of a multiple of 32 that some calls run
    on the kernels (not those whose every call the AMX tiles take, :func:`amx_tiles`, nor a
    GGUF file's blocks, ``exact_x``); None for neither or while the switch is off."""
    if not int8_activations():
        return None
    packed = [getattr(m, "native", None) for m in model.modules()]
    if any(
        getattr(p, "superblock_constants", False) or getattr(p, "superblock_form", 0)
        for p in packed
    ):
        return "K-quants"
    all_on_tiles = amx_tiles()
    if any(
        isinstance(p, Int4Packed)
        and p.group_size % X8_GROUP == 0
        and not p.exact_x
        and not (all_on_tiles and p.tiles and p.tiles_from_rows <= 1)
        for p in packed
    ):
        return "int4 groups"
    return None


def amx_tiles(switched: bool = True) -> bool:
    """Whether int4 matmuls (group sizes a multiple of 32) and six-bit int8-group matmuls run
    on the AMX tiles now (``csrc/quant_amx.cpp``): the library was built with AMX BF16, the OS
    grants the tile state, ``SPECSERVE_AMX`` is not ``0`` and ``SPECSERVE_QUANT_AMX`` is ``1``
    (off by default; both read on every call, as the kernels read them); with
    ``switched=False``, whether they are there at all, ``SPECSERVE_QUANT_AMX`` aside: a draft
    model's weights take them in calls of ``tiles_from_rows`` rows or more wherever they are
    (``fused_layer.allow_tiles``). Weights whose ``tiles`` is False stay on the ``vdpbf16ps``
    kernels. A one-row matmul is slower on the tiles, one of several rows faster: they serve
    the target of speculative decoding. The tiles sum each group's products in another order
    than ``vdpbf16ps``, so outputs differ from those kernels' by rounding; rows stay batch
    invariant. False where the kernel is not available."""
    return available() and bool(torch.ops.specserve.quant_amx_active(switched))
