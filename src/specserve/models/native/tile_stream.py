"""The tile stream shared by the int4 and int8-group kernels' packed weights.

Both kernels read a weight as tiles of 16 output rows, each a run of 64-byte blocks along K
(``block_k`` inputs a block: 8 for int4, 4 for int8), and per group of ``G`` inputs two fp16
constants for each of the tile's 16 rows (``[2, 16]`` fp16: exactly one 64-byte block). The
constants live either **inline**, as one more block after each group's ``G / block_k`` code
blocks, so that a tile is a single stream of codes and constants (what :func:`allocate`
gives by default), or **apart** in their own ``[tiles, K / G, 2, 16]`` tensor, the earlier
layout, kept so that benchmarks can run both in one process. The kernels' arithmetic is the
same for both; only where they read the constants differs. With the constants inline, the
``scales`` tensor handed to the kernels is empty. :meth:`PackedTiles.matmul` is the call both
kernels' modules make (``int4_native.matmul``, ``int8_native.matmul``): input checks, rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from specserve.models.native import huge_pages
from specserve.models.native.availability import Availability

__all__ = [
    "TILE_ROWS",
    "PackedTiles",
    "allocate",
    "code_blocks",
    "constants",
    "group_views",
    "layout_k",
]

TILE_ROWS = 16  # output rows per tile
_INPUT_DTYPES = (torch.bfloat16, torch.float32)  # what the matmul ops take as x
BLOCK_BYTES = 64


def allocate(
    tiles: int, k: int, group_size: int, block_k: int, dtype: torch.dtype, inline: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(qweight, scales, code_view, constant_view)`` for a weight of ``tiles`` tiles and
    ``k`` inputs, uninitialised (huge pages where the host allows: the weight is streamed once
    per token). Write the code blocks through ``code_view # [tiles, K / G, G / block_k, 64]``
    and the constants through ``constant_view # [tiles, K / G, 2, 16] fp16``: both are views
    into ``qweight`` (inline) or into ``qweight`` and ``scales`` (apart)."""
    ngroups, bpg = k // group_size, group_size // block_k
    if inline:
        qweight = huge_pages.empty((tiles, ngroups * (bpg + 1), BLOCK_BYTES), dtype)
        code_view, constant_view = group_views(qweight.view(tiles, ngroups, bpg + 1, BLOCK_BYTES))
        return qweight, torch.empty(0, dtype=torch.float16), code_view, constant_view
    qweight = huge_pages.empty((tiles, k // block_k, BLOCK_BYTES), dtype)
    scales = huge_pages.empty((tiles, ngroups, 2, TILE_ROWS), torch.float16)
    return qweight, scales, qweight.view(tiles, ngroups, bpg, BLOCK_BYTES), scales


def group_views(grouped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(code blocks, constants)`` of a tile stream with the constants inline, seen per group:
    ``grouped # [tiles, K / G, blocks per group + 1, 64]`` -> its code blocks
    ``# [tiles, K / G, blocks per group, 64]`` and constants ``# [tiles, K / G, 2, 16] fp16``
    (both views)."""
    tiles, ngroups = grouped.shape[:2]
    constant_view = grouped[:, :, -1].view(torch.float16).view(tiles, ngroups, 2, TILE_ROWS)
    return grouped[:, :, :-1], constant_view


def layout_k(
    qweight: torch.Tensor, scales: torch.Tensor, group_size: int, block_k: int
) -> tuple[int, bool]:
    """``(K, inline)`` of a packed weight's ``qweight # [tiles, blocks, 64]`` and ``scales``
    (empty: the constants are inline), checked against ``group_size``.

    Raises:
        ValueError: the group size is not a positive multiple of ``block_k``, the blocks are
            not whole groups, or ``scales`` has the wrong dtype or shape.
    """
    if group_size <= 0 or group_size % block_k:
        raise ValueError(f"group_size {group_size} must be a positive multiple of {block_k}")
    tiles, blocks = qweight.shape[0], qweight.shape[1]
    inline = scales.numel() == 0
    if inline:
        per_group = group_size // block_k + 1  # the code blocks and the constants block
        if blocks % per_group:
            raise ValueError(
                f"qweight with inline constants must have a multiple of {per_group} blocks "
                f"per tile for group_size {group_size}, got {blocks}"
            )
        k = blocks // per_group * group_size
    else:
        k = blocks * block_k
        if k % group_size:
            raise ValueError(
                f"group_size {group_size} must be a multiple of {block_k} dividing {k}"
            )
    if scales.dtype != torch.float16 or (
        not inline and scales.shape != (tiles, k // group_size, 2, TILE_ROWS)
    ):
        raise ValueError(
            f"scales must be fp16 [{tiles}, {k // group_size}, 2, 16], or empty fp16 with the "
            f"constants inline, got {scales.dtype} {tuple(scales.shape)}"
        )
    return k, inline


def code_blocks(qweight: torch.Tensor, group_size: int, block_k: int) -> torch.Tensor:
    """The code blocks of an inline ``qweight``, ``# [tiles, K / block_k, 64]`` (a copy)."""
    bpg = group_size // block_k
    codes = group_views(qweight.view(qweight.shape[0], -1, bpg + 1, BLOCK_BYTES))[0]
    return codes.reshape(qweight.shape[0], -1, BLOCK_BYTES)


def constants(qweight: torch.Tensor, group_size: int, block_k: int) -> torch.Tensor:
    """The constants of an inline ``qweight``, ``# [tiles, K / G, 2, 16] fp16`` (a view)."""
    bpg = group_size // block_k
    return group_views(qweight.view(qweight.shape[0], -1, bpg + 1, BLOCK_BYTES))[1]


# The matmul ops' ``tiles`` argument (``PackedWeight::tiles`` in csrc/int4_gemv.h): never on
# the AMX tiles; on them where SPECSERVE_QUANT_AMX=1 (a target's weights, every call); on them
# wherever the CPU and OS have them (a draft model's calls of several rows) ...
TILES_NEVER, TILES_SWITCHED, TILES_PERMITTED = 0, 1, 2
# ... plus whether a one-row call may quantise x to int8 (a draft model's weights; the AVX2
# int4 kernel's cheaper path, ``int4_native.quantised_x``; the other kernels ignore it).
QUANTISED_X = 4
# ... plus whether x stays bf16 for per-group int4 constants where the kernel would take int8
# activations (``int4_native.int8_activations``): a GGUF file's Q4_0 / Q4_1 blocks
# (``exact_x``), whose numbers the gguf format keeps (int8 x cost SmolLM2's Q4_1 file 0.1 %
# more log-likelihood, docs/benchmarks.md); the K-quants and the int4 format take int8 x.
EXACT_X = 8
# the bits of the AMX tiles' choice in a mode
TILES_MASK = 3


def exact_x_bit(modules: Iterable[object]) -> int:
    """:data:`EXACT_X` if the packed weight (``.native``) of any of ``modules`` keeps x exact,
    else 0: a fused layer op takes one mode for all its projections."""
    return (
        EXACT_X
        if any(getattr(getattr(m, "native", None), "exact_x", False) for m in modules)
        else 0
    )


@dataclass
class PackedTiles:
    """What the packed int4 and int8-group weights share: their fields, the checks of their
    tensors, their code blocks and constants whichever the layout, their size and the matmul
    call. Subclasses (dataclasses too) set ``BLOCK_K`` and ``CODE_DTYPE`` and document their
    tensors' layouts; ``in_features`` and ``inline_constants`` are derived here.

    A weight with ``tiles_from_rows`` 1 (a target's) takes the tiles in every call where
    ``SPECSERVE_QUANT_AMX=1``: its rows stay batch invariant, and the switch is the user's
    opt-in to slower one-token steps. One with more (a draft model's) takes them in its calls
    of that many rows or more wherever the CPU has them, where they are faster: it chooses
    per call, so its rows are not batch invariant, which proposals need not be. For the same
    reason a draft's weight may have ``quantised_x``: its one-row calls round x to int8 where
    the kernel has such a path (``int4_native.quantised_x``)."""

    BLOCK_K: ClassVar[int]
    CODE_DTYPE: ClassVar[torch.dtype]
    qweight: torch.Tensor
    scales: torch.Tensor
    row_scale: torch.Tensor
    out_features: int
    group_size: int
    in_features: int = field(init=False)
    inline_constants: bool = field(init=False)
    # Whether the weight may run on the AMX tiles when they are on (amx_tiles()), and from how
    # many input rows a call on: 1 for a target's weights (rows batch invariant), more for a
    # draft model's (fused_layer.allow_tiles).
    tiles: bool = field(default=True, init=False)
    tiles_from_rows: int = field(default=1, init=False)
    # A draft model's weights: one-row calls may round x to int8 (fused_layer.set_draft).
    quantised_x: bool = field(default=False, init=False)
    # Per-group int4 constants of a GGUF file's blocks: x stays bf16 (EXACT_X). The
    # int8-group kernel never takes int8 activations for per-group constants: False there.
    exact_x: bool = field(default=False, init=False)

    def tile_mode(self, rows: int) -> int:
        """The ops' ``tiles`` argument for a call with ``rows`` input rows."""
        x_bits = (QUANTISED_X if self.quantised_x else 0) | (EXACT_X if self.exact_x else 0)
        if not self.tiles or rows < self.tiles_from_rows:
            return TILES_NEVER | x_bits
        return (TILES_SWITCHED if self.tiles_from_rows == 1 else TILES_PERMITTED) | x_bits

    def op_args(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
        """What the matmul ops (``int4_gemm``, ``int8_gemm``) take after ``x # [rows, K]``."""
        return (
            self.qweight,
            self.scales,
            self.row_scale,
            self.out_features,
            self.group_size,
            self.tile_mode(rows),
        )

    def matmul(
        self, x: torch.Tensor, op: Callable[..., torch.Tensor], kernel: Availability
    ) -> torch.Tensor:
        """``x # [..., K]`` (bf16 or fp32, CPU) @ this weight ``.T`` -> ``# [..., N]`` through
        ``op`` (``int4_gemm`` / ``int8_gemm``), the kernel ``kernel`` says is loaded.

        The result has ``x``'s dtype (fp32 inputs are rounded to bf16 first, the output stays
        fp32). Only :meth:`Availability.loaded` is checked, not the kernel's switch: that is
        for the callers' setup.

        Raises:
            ValueError: wrong dtype, device or last dimension of ``x``.
            RuntimeError: the kernel is not loaded.
        """
        k = self.in_features
        if x.dtype not in _INPUT_DTYPES or not x.is_cpu or x.dim() == 0 or x.shape[-1] != k:
            raise ValueError(
                f"{kernel.what} matmul takes CPU bf16 / fp32 inputs [..., {k}], got "
                f"{x.dtype} {tuple(x.shape)} on {x.device}"
            )
        if not kernel.loaded():
            reason = kernel.unavailable_reason()
            raise RuntimeError(f"the native {kernel.what} kernel is not loaded: {reason}")
        x2 = x if x.dim() == 2 else x.reshape(-1, k)
        y = op(x2, *self.op_args(x2.shape[0]))
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def __post_init__(self) -> None:
        q, r = self.qweight, self.row_scale
        tiles = q.shape[0]
        self.in_features, self.inline_constants = self._layout_k()
        if not (tiles - 1) * TILE_ROWS < self.out_features <= tiles * TILE_ROWS:
            raise ValueError(f"out_features {self.out_features} does not fit {tiles} tiles")
        if r.dtype != torch.float32 or r.shape != (tiles * TILE_ROWS,):
            raise ValueError(f"row_scale must be fp32 [{tiles * TILE_ROWS}]")

    def _layout_k(self) -> tuple[int, bool]:
        """``(K, inline)`` of ``qweight`` and ``scales``, checked (see :func:`layout_k`).

        Raises:
            ValueError: wrong dtype or shape of ``qweight``, or as :func:`layout_k`.
        """
        q = self.qweight
        if q.dtype != self.CODE_DTYPE or q.dim() != 3 or q.shape[2] != BLOCK_BYTES:
            code = str(self.CODE_DTYPE).removeprefix("torch.")
            raise ValueError(
                f"qweight must be {code} [Np/16, K/{self.BLOCK_K} (+ K/G), 64], "
                f"got {q.dtype} {q.shape}"
            )
        return layout_k(q, self.scales, self.group_size, self.BLOCK_K)

    def nbytes(self) -> int:
        """Bytes a matmul reads from the weight (codes, constants, row scales)."""
        return sum(
            t.numel() * t.element_size() for t in (self.qweight, self.scales, self.row_scale)
        )

    def code_blocks(self) -> torch.Tensor:
        """The code blocks alone, ``# [Np / 16, K / BLOCK_K, 64]`` (a copy when the constants
        are inline)."""
        if not self.inline_constants:
            return self.qweight
        return code_blocks(self.qweight, self.group_size, self.BLOCK_K)

    def constants(self) -> torch.Tensor:
        """Per tile and group the 16 rows' first constants, then their second ones,
        ``# [Np / 16, K / G, 2, 16] fp16`` (a view into ``qweight`` when inline)."""
        if not self.inline_constants:
            return self.scales
        return constants(self.qweight, self.group_size, self.BLOCK_K)
