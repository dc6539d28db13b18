"""Native CPU kernel for int8-group weight-only matmuls (AVX2 + FMA + F16C), built on first use.

``y = x @ w.T`` with bf16 (or fp32) activations ``x # [M, K]`` and the weights of
:class:`~specserve.models.quant.int8_group.Int8GroupWeight`: signed byte codes with a
(scale, offset) pair per group of ``group_size`` inputs of a row, ``w[n, k] = code[n, k] *
scale[n, g] + offset[n, g]``, ``g = k // group_size``. Quantised formats whose codes fit a
byte (up to 8 bits, signed or shifted) and whose groups are affine run on it from their stored
codes. The activations are not quantised: each code and each bf16 input become fp32 (both
exact, and so is their product) and meet in FMAs; per group
``y += scale·Σ code·x + offset·Σ x``. ``scale`` and ``offset`` are stored as fp16 after a
per-row power-of-two normalisation (~2e-4 relative error on the outputs, well under the bf16
rounding of the result).

Codes in -32 .. 31 (the K-quants' 4-, 5- and 6-bit codes) can travel in six bits (see
:class:`Int8Packed`), 3/4 of the bytes of the byte codes. The fp32 kernels unpack them to the
same bytes before the same arithmetic (bit-identical outputs), which costs them more time than
the bytes save, so :func:`pack` stores them so by default only where the CPU has AVX-512 BF16,
VBMI and GFNI (:func:`six_bit.dot_products`, :func:`six_bit.preferred`): there six-bit codes
run on a kernel of their own: ``code + 160`` is exact in bf16, and one ``vdpbf16ps``
multiplies two inputs' weights of 16 rows by a pair of bf16 inputs, with fp32 sums; per group
``y += scale·Σ (code + 160)·x + (offset - 160·scale)·Σ x``. Its outputs agree with the fp32
kernels' to rounding, its rows are batch invariant as theirs.

On AVX2 hosts with int8 activations (:func:`superblock.preferred`), six-bit codes whose
constants have the K-quants' superblock form (Q6_K's) keep it in quad order: 0.83 bytes a
weight against 1.25, on int8 x always (``run_block_quads`` in ``csrc/int8_gemv.cpp``;
``SPECSERVE_INT8_ACTIVATIONS=0`` at load packs byte codes on exact x instead).

Batch invariance: every output ``(m, n)`` runs the same fp32 operations in the same order
whatever ``M`` is, whatever the other rows hold and however the threads split the work (they
split the output columns only, with torch's intra-op pool), so a ``k + 1``-row verify gives bit
for bit what a 1-row decode gives.

Usage::

    if int8_native.available():
        packed = int8_native.pack(weight)  # once, at load; Int8Packed's tensors are buffers
        y = int8_native.matmul(x, packed)  # [..., N]

Build: ``build.py`` compiles ``csrc/int8_gemv.cpp`` into the op library with the other
kernels; the op is ``torch.ops.specserve.int8_gemm``, and ``int4_decoder_layer``
(fused_layer.py) takes int8-group projections too. :func:`available` is False (the reason
logged once, see :func:`unavailable_reason`) when ``SPECSERVE_INT8_NATIVE=0``, on a CPU
without AVX2 / FMA / F16C, or when the build or the self-test fails; callers then fall back.

This module does not import the weight's module (``models/quant/int8_group.py`` imports this
one): :func:`pack` takes any object with that weight's four attributes (:class:`GroupWeight`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from specserve.models.native import build, huge_pages, six_bit, superblock, tile_stream
from specserve.models.native.availability import Availability
from specserve.models.native.int4_native import tile_constants

logger = logging.getLogger(__name__)

__all__ = [
    "BLOCK_K",
    "TILE_ROWS",
    "GroupWeight",
    "Int8Packed",
    "available",
    "matmul",
    "pack",
    "unavailable_reason",
]

TILE_ROWS = tile_stream.TILE_ROWS  # output rows per tile: two 8-lane halves
BLOCK_K = 4  # input channels per 64-byte block of a tile
_PACK_ROW_CHUNK = 4096  # rows packed at a time (bounds the temporaries of an LM head)
_ENV_SWITCH = "SPECSERVE_INT8_NATIVE"


class GroupWeight(Protocol):
    """What :func:`pack` reads: ``codes # [N, K] int8``, ``scale`` and ``offset``
    ``# [N, K // group_size]`` (``w = codes * scale + offset`` per group), ``group_size``."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    group_size: int


# ---------------------------------------------------------------- packed weights ------------


@dataclass
class Int8Packed(tile_stream.PackedTiles):
    """An int8-group weight in the native kernel's layout (plain CPU tensors: module buffers).

    With ``Np = N`` rounded up to a multiple of 16 (padding rows are zero and never written
    out), ``K`` the input features and ``G`` the group size:

    Attributes:
        qweight: ``# [Np / 16, K / 4 + K / G, 64] int8`` (constants inline, what :func:`pack`
            writes) or ``# [Np / 16, K / 4, 64]`` (constants apart): see
            :mod:`~specserve.models.native.tile_stream`. One 64-byte block per tile of 16
            output rows and 4 input channels ``k0 .. k0 + 3``; a tile's blocks follow each
            other along K, so a tile is one contiguous stream. Byte ``h*32 + c*8 + r`` (``h``
            in 0..1, ``c`` in 0..3, ``r`` in 0..7) is ``code[8h + r, k0 + c]``:
            sign-extending the 8 bytes at ``h*32 + c*8`` to 32 bits gives input ``c``'s codes
            of rows ``8h .. 8h + 7``, one row per fp32 lane. Inline, each group's ``G / 4``
            code blocks are followed by the group's constants block (as in ``scales``).
        scales: ``# [Np / 16, K / G, 2, 16] fp16`` (constants apart; empty when inline): per
            tile and group the 16 rows' scales, then their offsets, each divided by the row's
            ``row_scale``.
        row_scale: ``# [Np] fp32``: a power of two per row, at least the row's largest
            ``|scale|`` / ``|offset|`` (1 for all-zero and padding rows), so the fp16 values
            lie in [-1, 1] whatever the weights' magnitude; the kernel multiplies it back.
        out_features: ``N`` (the kernel writes exactly ``N`` columns).
        group_size: ``G`` (a multiple of 4 dividing ``K``).
        in_features: ``K`` (derived from ``qweight``).
        inline_constants: whether the constants are inline (``scales`` is empty).

    **Six-bit codes** (codes in -32 .. 31, ``G`` a multiple of 16, the constants inline):
    ``qweight # [Np / 16, K / G, 3 G / 16 + 1, 64] int8`` instead, per tile and group ``G / 16``
    units of three blocks, then the constants block. A unit holds the codes of the tile's 16
    rows and 16 inputs ``k0 .. k0 + 15`` as ``u = code + 32``; with ``u_b[16 c + i]`` that of
    row ``i`` and input ``k0 + 4 b + c``, its blocks are ``L0 = u_0 & 15 | (u_1 & 15) << 4``,
    ``L1 = u_2 & 15 | (u_3 & 15) << 4`` and ``H = u_0 >> 4 | (u_1 >> 4) << 2 | (u_2 >> 4) << 4
    | (u_3 >> 4) << 6`` (bytewise). :attr:`code_bits` tells the two apart.
    """

    BLOCK_K: ClassVar[int] = BLOCK_K
    CODE_DTYPE: ClassVar[torch.dtype] = torch.int8

    def _layout_k(self) -> tuple[int, bool]:
        """As :meth:`PackedTiles._layout_k`; a four- or five-dimensional ``qweight`` holds
        six-bit codes, their constants always inline (:func:`superblock.six_bit_in_features`)."""
        if self.qweight.dim() < 4:
            return super()._layout_k()
        return superblock.six_bit_in_features(self.qweight, self.group_size, self.scales), True

    @property
    def code_bits(self) -> int:
        """6 for six-bit codes, else 8."""
        return 6 if self.qweight.dim() >= 4 else 8

    @property
    def quads(self) -> bool:
        """Whether six-bit units with superblock constants keep their bytes in quad order
        (``qweight # [Np / 16, K / S, H + 3 S / 16, 2, 32]``, :func:`superblock.pack`)."""
        return self.qweight.dim() == 5

    @property
    def superblock_form(self) -> int:
        """0: per-group fp16 constants; six-bit codes with superblock constants
        (:mod:`~specserve.models.native.superblock`): 1 without offsets, 2 with them."""
        if self.code_bits == 8 or (
            not self.quads and self.qweight.shape[2] == six_bit.unit_blocks(self.group_size) + 1
        ):
            return 0
        head = self.qweight.shape[2] - six_bit.unit_blocks(self.group_size)
        return 2 if head == superblock.header_blocks(self.group_size, True) else 1

    def code_blocks(self) -> torch.Tensor:
        """The byte code blocks, ``# [Np / 16, K / 4, 64]`` (six-bit codes: unpacked, a copy)."""
        if self.code_bits == 8:
            return super().code_blocks()
        tiles = self.qweight.shape[0]
        head = self.qweight.shape[2] - six_bit.unit_blocks(self.group_size)
        q = self.qweight.reshape(*self.qweight.shape[:3], 64)
        units = q[:, :, :-1] if head == 1 else q[:, :, head:]
        units = units.reshape(tiles, -1, 3, 64)
        return six_bit.unpack_units(units, self.quads).reshape(tiles, -1, 64)

    def constants(self) -> torch.Tensor:
        """As :meth:`PackedTiles.constants` (six-bit codes: a view into ``qweight``)."""
        if self.code_bits == 8:
            return super().constants()
        if self.superblock_form:
            raise ValueError("superblock constants have no per-group fp16 form")
        return tile_stream.group_views(self.qweight)[1]


def _pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """``codes # [n, K] int8`` (``n`` a multiple of 16) -> ``# [n / 16, K / 4, 64] int8``."""
    n, k = codes.shape
    # row = 8h + r and k = 4B + c  ->  byte h*32 + c*8 + r of block B.
    v = codes.view(n // TILE_ROWS, 2, 8, k // BLOCK_K, BLOCK_K)  # [T, h, r, B, c]
    return v.permute(0, 3, 1, 4, 2).reshape(n // TILE_ROWS, k // BLOCK_K, 64)


def pack(
    weight: GroupWeight,
    *,
    inline_constants: bool = True,
    code_bits: int | None = None,
    superblocks: bool | None = None,
) -> Int8Packed:
    """Repack ``weight`` for :func:`matmul` (a row chunk at a time: no big temporaries),
    with each group's constants inline in its tile's stream (the default) or apart in
    ``scales`` (``inline_constants=False``, for A/B benchmarks; the same bits out).

    ``code_bits``: 6 stores the codes in six bits (they must lie in -32 .. 31, the group size
    be a multiple of 16 and the constants inline), 8 as bytes; None (the default) takes 6
    wherever those hold and :func:`six_bit.preferred` says six-bit codes pay here. The fp32
    kernels give both the same bits; where six-bit codes run as bf16 pairs
    (:func:`six_bit.dot_products`) their sums round differently.

    ``superblocks``: True writes six-bit codes of 16-input groups with superblock constants
    (:mod:`~specserve.models.native.superblock`: fewer bytes, the same weights; in quad order
    where :func:`superblock.quad_order`), False never; None (the default) wherever
    :func:`superblock.preferred` and the constants factor (``code_bits`` None: six bits then).

    Raises:
        ValueError: ``group_size`` is not a multiple of 4 dividing K, the codes are not int8,
            the scales / offsets are not finite, ``code_bits=6`` where six bits do not fit, or
            ``superblocks=True`` where the constants do not factor.
    """
    codes_all, gs = weight.codes, weight.group_size
    if codes_all.dtype != torch.int8 or codes_all.dim() != 2:
        raise ValueError(f"codes must be int8 [N, K], got {codes_all.dtype} {codes_all.shape}")
    n, k = codes_all.shape
    if gs <= 0 or gs % BLOCK_K or k % gs:
        raise ValueError(
            f"the int8-group kernel needs a group_size that is a multiple of 4 dividing K={k}, "
            f"got {gs}"
        )
    if weight.scale.shape != (n, k // gs) or weight.offset.shape != (n, k // gs):
        raise ValueError(f"scale and offset must be [{n}, {k // gs}]")
    six_fits = inline_constants and gs % six_bit.UNIT_K == 0
    if code_bits == 6:
        if not six_fits:
            raise ValueError(
                "six-bit codes need the constants inline and a group_size that is a multiple "
                f"of 16, got group_size {gs}, inline_constants={inline_constants}"
            )
        if not six_bit.codes_fit(codes_all):
            raise ValueError("six-bit codes must lie in -32 .. 31")
    elif code_bits not in (None, 8):
        raise ValueError(f"code_bits must be 6, 8 or None, got {code_bits}")
    wanted = superblocks or (superblocks is None and superblock.preferred())
    # six bits where asked, or where preferred (with superblocks or not) and the codes fit
    asked = code_bits == 6 or (code_bits is None and six_fits and (wanted or six_bit.preferred()))
    six = asked and (code_bits == 6 or six_bit.codes_fit(codes_all))  # scans every code
    if superblocks and not (six and gs == six_bit.UNIT_K):
        raise ValueError("superblock constants need six-bit codes in groups of 16")
    if six and gs == six_bit.UNIT_K and wanted:
        sb = superblock.pack(codes_all, weight.scale, weight.offset, superblock.quad_order())
        if sb is not None:
            return Int8Packed(sb[0], torch.empty(0, dtype=torch.float16), sb[1], n, sb[2])
        if superblocks:
            raise ValueError("these constants have no superblock form (superblock.factor)")
    if code_bits is None:
        code_bits = 6 if six and six_bit.preferred() else 8
    tiles = -(-n // TILE_ROWS)
    ngroups, bpg = k // gs, gs // BLOCK_K
    # Streamed once per token: huge pages where the host allows (models/native/huge_pages.py).
    if code_bits == 6:
        qweight = huge_pages.empty((tiles, ngroups, six_bit.unit_blocks(gs) + 1, 64), torch.int8)
        scales = torch.empty(0, dtype=torch.float16)
        units, const_view = tile_stream.group_views(qweight)
        code_view = units.view(tiles, ngroups, gs // six_bit.UNIT_K, 3, 64)
    else:
        qweight, scales, code_view, const_view = tile_stream.allocate(
            tiles, k, gs, BLOCK_K, torch.int8, inline_constants
        )
    row_scale = torch.ones(tiles * TILE_ROWS, dtype=torch.float32)
    for start in range(0, n, _PACK_ROW_CHUNK):  # a multiple of 16: chunks are whole tiles
        stop = min(n, start + _PACK_ROW_CHUNK)
        rows, t0 = stop - start, start // TILE_ROWS
        pad = -rows % TILE_ROWS
        codes = codes_all[start:stop].cpu()
        s = weight.scale[start:stop].detach().cpu().float()
        off = weight.offset[start:stop].detach().cpu().float()
        if pad:
            codes = torch.nn.functional.pad(codes, (0, 0, 0, pad))
            s = torch.nn.functional.pad(s, (0, 0, 0, pad))
            off = torch.nn.functional.pad(off, (0, 0, 0, pad))
        if not (torch.isfinite(s).all() and torch.isfinite(off).all()):
            raise ValueError("int8-group scales / offsets must be finite")
        t1 = t0 + (rows + pad) // TILE_ROWS
        if code_bits == 6:
            code_view[t0:t1] = six_bit.pack_units(codes).view(code_view[t0:t1].shape)
        else:
            code_view[t0:t1] = _pack_codes(codes).view(t1 - t0, ngroups, bpg, 64)
        const_view[t0:t1], row_scale[t0 * TILE_ROWS : t1 * TILE_ROWS] = tile_constants(s, off)
    return Int8Packed(qweight, scales, row_scale, n, gs)


# ---------------------------------------------------------------- matmul --------------------


def matmul(x: torch.Tensor, packed: Int8Packed) -> torch.Tensor:
    """``x # [..., K]`` (bf16 or fp32, CPU) @ the packed weight ``.T`` -> ``# [..., N]``
    (``PackedTiles.matmul``: fp32 inputs rounded to bf16, the result in ``x``'s dtype).
    Call only after :func:`available` returned True: this checks that the kernel is loaded,
    not ``SPECSERVE_INT8_NATIVE`` (that switch is for the callers' setup).

    Raises:
        ValueError: wrong dtype, device or last dimension of ``x``.
        RuntimeError: the kernel is not loaded.
    """
    return packed.matmul(x, torch.ops.specserve.int8_gemm, _kernel)


# ---------------------------------------------------------------- load ----------------------


@dataclass
class _Weight:
    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    group_size: int


def _load() -> str | None:
    """Build (or reuse) and load the kernel; None on success, else why not."""
    return build.load_library() or _self_test()


def _self_test() -> str | None:
    """Run the kernel on a small random weight, with byte codes and with six-bit codes (with
    superblock constants too where they are packed here, in quad order on AVX2 hosts): close
    to a float64 reference, and each row of a 5-row call bit-identical to the same row alone
    (catches a CPU without the ISA, which the op reports, and a miscompiled kernel)."""
    gen = torch.Generator().manual_seed(0)
    n, k, gs = 37, 128, 16
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, k // gs, generator=gen) * 0.01 + 1e-3
    offset = torch.randn(n, k // gs, generator=gen) * 0.1
    x = torch.randn(5, k, generator=gen).to(torch.bfloat16)
    # K-quant constants (fp16 d per 64 inputs times int8 codes): superblock constants where
    # the CPU runs them
    d = (torch.rand(n, k // 64, generator=gen) * 1e-3).half().float().repeat_interleave(4, 1)
    k_quant = d * torch.randint(-128, 128, (n, k // gs), generator=gen).float()
    weights = [_Weight(codes, scale, offset, gs), _Weight(codes >> 2, scale, offset, gs)]
    for weight in [*weights, _Weight(codes >> 2, k_quant, torch.zeros_like(k_quant), gs)]:
        packed = pack(weight)
        args = (packed.qweight, packed.scales, packed.row_scale, n, packed.group_size)
        try:
            y = torch.ops.specserve.int8_gemm(x, *args)
            rows = [torch.ops.specserve.int8_gemm(x[i : i + 1], *args) for i in range(5)]
        except Exception as exc:  # the op refuses this CPU, or is missing from the library
            return f"self-test failed: {type(exc).__name__}: {exc}"
        w = weight.codes.double().view(n, k // gs, gs) * weight.scale.double()[..., None]
        w = (w + weight.offset.double()[..., None]).view(n, k)
        ref = x.double() @ w.T
        err = float((y.double() - ref).norm() / ref.norm())
        what = f"{packed.code_bits}-bit codes" + (", superblocks" if packed.superblock_form else "")
        if not err < 1e-2:
            return f"self-test failed ({what}): relative error {err:.3g} against the reference"
        if not torch.equal(y, torch.cat(rows)):
            return f"self-test failed ({what}): rows depend on the batch"
    return None


_kernel = Availability("int8-group", _ENV_SWITCH, lambda: _load(), logger)


def available() -> bool:
    """Whether :func:`matmul` can run here (builds / loads the library on the first call).

    False when ``SPECSERVE_INT8_NATIVE=0`` (checked on every call), or after a failed build /
    an unsupported CPU (decided once per process, the reason logged once).
    """
    return _kernel.available()


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True or was never asked)."""
    return _kernel.unavailable_reason()
