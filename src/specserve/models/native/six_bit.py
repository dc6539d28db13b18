"""Six-bit codes in the int8-group kernel's tile stream (see
:class:`~specserve.models.native.int8_native.Int8Packed`): the packing of codes in -32 .. 31
into units of three 64-byte blocks per 16 rows and 16 inputs, its inverse (the byte layout's
blocks, for checks), and whether six-bit codes run on the bf16-pair kernel here.
"""

from __future__ import annotations

import os

import torch

from specserve.models.native import build, int4_native
from specserve.models.native.tile_stream import TILE_ROWS

__all__ = [
    "UNIT_K",
    "codes_fit",
    "dot_products",
    "pack_units",
    "pair_kernel_built",
    "preferred",
    "unit_blocks",
    "unpack_units",
]

UNIT_K = 16  # inputs per six-bit unit (three 64-byte blocks)


def unit_blocks(group_size: int) -> int:
    """Code blocks per group of six-bit codes."""
    return 3 * group_size // UNIT_K


def pack_units(codes: torch.Tensor, quads: bool = False) -> torch.Tensor:
    """``codes # [n, K] int8`` in -32 .. 31 (``n`` a multiple of 16, ``K`` of 16) -> the
    six-bit units, ``# [n / 16, K / 16, 3, 64] int8`` (the module docstring's layout).

    ``quads``: each block's bytes in quad order instead, ``u_b[4 i + c]`` for row ``i`` and
    input ``k0 + 4 b + c`` (a row's four inputs side by side, rows in order: the operands of
    the AVX2 kernel's ``vpmaddubsw``, ``run_block_quads`` in ``csrc/int8_gemv.cpp``)."""
    n, k = codes.shape
    # row i of tile T, input 16 U + 4 b + c  ->  u_b[16 c + i] (u_b[4 i + c] in quad order)
    v = codes.view(n // TILE_ROWS, TILE_ROWS, k // UNIT_K, 4, 4)  # [T, i, U, b, c]
    order = (0, 2, 3, 1, 4) if quads else (0, 2, 3, 4, 1)  # [T, U, b, i, c] or [T, U, b, c, i]
    u = (v.permute(*order).to(torch.int16) + 32).to(torch.uint8)
    u = u.reshape(n // TILE_ROWS, k // UNIT_K, 4, 64)
    low, high = u & 15, u >> 4
    blocks = torch.stack(
        (
            low[:, :, 0] | (low[:, :, 1] << 4),
            low[:, :, 2] | (low[:, :, 3] << 4),
            high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6),
        ),
        dim=2,
    )
    return blocks.view(torch.int8)


def unpack_units(units: torch.Tensor, quads: bool = False) -> torch.Tensor:
    """Six-bit units ``# [T, U, 3, 64] int8`` (in quad order with ``quads``, see
    :func:`pack_units`) -> their byte code blocks in the byte layout, ``# [T, U * 4, 64]
    int8`` (what the byte packing writes for the same codes)."""
    b = units.view(torch.uint8)
    l0, l1, hb = b[:, :, 0], b[:, :, 1], b[:, :, 2]
    u = torch.stack(
        (
            (l0 & 15) | ((hb & 3) << 4),
            (l0 >> 4) | (((hb >> 2) & 3) << 4),
            (l1 & 15) | (((hb >> 4) & 3) << 4),
            (l1 >> 4) | ((hb >> 6) << 4),
        ),
        dim=2,
    )  # [T, U, b, 64 = (c, i)], or (i, c) in quad order
    t, nu = units.shape[:2]
    if quads:
        u = u.view(t, nu, 4, TILE_ROWS, 4).transpose(3, 4)
    codes = (u.to(torch.int16) - 32).to(torch.int8)
    # byte layout: block 4 U + b, byte h * 32 + c * 8 + r for row i = 8 h + r
    v = codes.reshape(t, nu, 4, 4, 2, 8).permute(0, 1, 2, 4, 3, 5)  # [T, U, b, h, c, r]
    return v.reshape(t, nu * 4, 64)


_DOT_FLAGS = ("avx512bw", "avx512vbmi", "avx512_bf16", "gfni")


def dot_products() -> bool:
    """Whether six-bit codes run as bf16 pairs here: on the AMX tiles
    (:func:`~specserve.models.native.int4_native.amx_tiles`), or on the ``vdpbf16ps`` kernel
    where the CPU has AVX-512 BW, VBMI, BF16 and GFNI (the library is built for this CPU,
    ``-march=native``) and ``SPECSERVE_INT8_AVX512`` is not ``0`` (which runs the fp32 8-lane
    kernels for every layout). Read on every call, like the kernels read the switches."""
    if int4_native.amx_tiles():
        return True
    if os.environ.get("SPECSERVE_INT8_AVX512") == "0":
        return False
    return pair_kernel_built()


def pair_kernel_built() -> bool:
    """Whether the library's ``vdpbf16ps`` kernels of six-bit codes are built here: a CPU with
    AVX-512 BW, VBMI, BF16 and GFNI (the library is built for this CPU, ``-march=native``)."""
    return all(flag in build.cpu_signature()[1] for flag in _DOT_FLAGS)


def preferred() -> bool:
    """Whether :func:`~specserve.models.native.int8_native.pack` stores codes that fit in six
    bits so by default: where they run as bf16 pairs (:func:`dot_products`), whose kernel reads
    them as stored. The fp32 kernels unpack six-bit codes to bytes first, which costs more than
    the quarter of the bytes it saves: on an AVX2 host (Zen 3) a gguf 1.5B step took 0.87 of
    the time with byte codes at one token and 0.78 at five (``python
    benchmarks/int8_group_kernel.py --part step --switch codes``, docs/benchmarks.md).
    ``SPECSERVE_SIX_BIT_CODES=1`` (or ``0``) forces six bits (or bytes) wherever they fit.
    Read on every call."""
    forced = os.environ.get("SPECSERVE_SIX_BIT_CODES", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return dot_products()


def codes_fit(codes: torch.Tensor) -> bool:
    """Whether every code lies in -32 .. 31."""
    return codes.numel() == 0 or (int(codes.min()) >= -32 and int(codes.max()) <= 31)
