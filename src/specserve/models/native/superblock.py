"""Six-bit codes with superblock constants: the K-quants' own form of their group constants.

A GGUF K-quant block holds, per superblock of 256 inputs of a row, an fp16 scale ``d`` (and
for Q4_K / Q5_K an fp16 ``dmin``) and per sub-group a small integer scale code ``sc`` (and
minimum code ``m``): a sub-group's scale is ``d·sc``, its offset ``−dmin·m``. Per-group fp16
constants, the int8-group kernel's usual form, spend 32 bits a sub-group on what the file
stores in 6 - 8; for Q6_K's sub-groups of 16 that is 8 bits a weight against the file's 6.56.
Here each sub-group keeps an int8 scale code (and offset code), each superblock an fp32 ``d``
(and ``e``): 6.6 bits a weight without offsets, 7.3 with them, and the constants exact.

:func:`factor` recovers such a form from any per-group constants that have it (it does not
need to know the file: the K-quants' products ``d·sc`` are exact in fp32, and a superblock's
scales share the factor ``d`` up to the greatest common divisor of their codes); :func:`pack`
writes the layout that ``int8_gemv.cpp``'s ``run_block_super`` reads (AVX-512 BF16, VBMI and
GFNI), or with each unit's bytes in quad order (:func:`six_bit.pack_units`) the one its AVX2
kernel ``run_block_quads`` reads on int8 activations; :func:`preferred` says where to write
either, :func:`quad_order` which.
"""

from __future__ import annotations

import os

import torch

from specserve.models.native import build, huge_pages, int4_native, six_bit
from specserve.models.native.tile_stream import BLOCK_BYTES, TILE_ROWS

__all__ = [
    "SUPERBLOCK",
    "factor",
    "header_blocks",
    "pack",
    "preferred",
    "quad_order",
    "six_bit_in_features",
    "unpack",
]

SUPERBLOCK = int4_native.SUPERBLOCK  # inputs a superblock (256, the K-quants'); a multiple of 64
_SUB = six_bit.UNIT_K  # inputs a sub-group: one six-bit unit
_ENV_SWITCH = "SPECSERVE_SUPERBLOCK_CONSTANTS"
_MAX_SHIFT = 38  # exponent spread a superblock's integers may take in int64
_ROW_CHUNK = 4096  # rows factored and packed at a time (a multiple of 16)


def preferred() -> bool:
    """Whether six-bit codes whose constants factor are packed with superblock constants:
    where the library's bf16-pair kernel for them runs (a CPU with AVX-512 BW, VBMI, BF16 and
    GFNI, the library built for it), or in quad order (:func:`quad_order`) on a CPU without
    AVX-512 where the kernels take int8 activations (:func:`int4_native.int8_activations`),
    and the AMX tiles are not on (they read per-group constants); unless
    ``SPECSERVE_SUPERBLOCK_CONSTANTS=0``. Read on every call."""
    if os.environ.get(_ENV_SWITCH, "").strip() == "0" or int4_native.amx_tiles():
        return False
    if six_bit.pair_kernel_built():
        return True
    return "avx512f" not in build.cpu_signature()[1] and int4_native.int8_activations()


def quad_order() -> bool:
    """Whether :func:`pack` writes each unit's bytes in quad order here: where the bf16-pair
    kernel is not built, so that the AVX2 kernel ``run_block_quads`` reads them (on int8
    activations always: ``SPECSERVE_INT8_ACTIVATIONS=0`` at load keeps per-group constants,
    :func:`preferred`)."""
    return not six_bit.pair_kernel_built()


def six_bit_in_features(qweight: torch.Tensor, group_size: int, scales: torch.Tensor) -> int:
    """``K`` of a six-bit ``qweight`` (``Int8Packed``'s checks): ``# [Np / 16, K / G,
    3 G / 16 + 1, 64] int8`` with per-group constants, ``3 G / 16 + H`` blocks a group with
    superblock constants (:func:`header_blocks`), those five-dimensional ``[..., 2, 32]`` in
    quad order; ``scales`` empty fp16 (the constants inline).

    Raises:
        ValueError: any other shape, dtype or group size.
    """
    q, gs = qweight, group_size
    if q.dim() == 5:
        if q.shape[3:] != (2, 32) or not q.is_contiguous() or gs % 64:
            raise ValueError(
                "six-bit qweight in quad order must be contiguous int8 [Np/16, K/G, blocks, "
                f"2, 32] with superblock constants (G a multiple of 64), got "
                f"{tuple(q.shape)} for group_size {gs}"
            )
        q = q.view(*q.shape[:3], BLOCK_BYTES)
    if gs <= 0 or gs % _SUB:
        raise ValueError(f"six-bit codes need a group_size that is a multiple of 16, got {gs}")
    units = six_bit.unit_blocks(gs)
    blocks = [units + 1]
    if gs % 64 == 0:  # superblock constants, without and with offsets
        blocks += [units + header_blocks(gs, o) for o in (False, True)]
    quads = qweight.dim() == 5
    if q.dtype != torch.int8 or q.shape[3] != BLOCK_BYTES or q.shape[2] not in blocks[quads:]:
        also = f" (superblock constants: {blocks[1]} or {blocks[2]})" if gs % 64 == 0 else ""
        raise ValueError(
            f"six-bit qweight must be int8 [Np/16, K/G, {blocks[0]}, 64]{also} for "
            f"group_size {gs}, got {q.dtype} {tuple(q.shape)}"
        )
    if scales.numel() or scales.dtype != torch.float16:
        raise ValueError("six-bit codes keep their constants inline: scales must be empty fp16")
    return int(q.shape[1]) * gs


def factor(values: torch.Tensor, per: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``values # [N, G] fp32`` (a constant per sub-group; ``per`` sub-groups a superblock,
    dividing ``G``) as ``d # [N, G / per] fp32`` times int8 codes ``# [N, G]``, exactly
    (``d·code == value`` in fp32), or None when some superblock has no such form.

    Per superblock, each value is an integer times a power of two; with the smallest power
    ``2^F`` common to all, ``d = ±g·2^F`` for ``g`` the integers' greatest common divisor,
    and the codes are the integers over ``d``'s integer: the smallest codes of that form (the
    sign chosen so that they fit in -128 .. 127).
    """
    n, groups = values.shape
    if groups % per or values.dtype != torch.float32:
        raise ValueError(f"values must be fp32 [N, a multiple of {per}]")
    if not torch.isfinite(values).all():
        return None
    v = values.reshape(n, groups // per, per)
    mant, exp = torch.frexp(v)  # v = mant · 2^exp, |mant| in [0.5, 1)
    ints = torch.ldexp(mant, torch.full_like(exp, 24)).to(torch.int64)  # exact: 24 bits
    power = (exp - 24).to(torch.int64)
    nonzero = ints != 0
    big = torch.iinfo(torch.int64).max
    low = torch.where(nonzero, power, big).amin(dim=2, keepdim=True)
    low = torch.where(low == big, 0, low)
    shift = torch.where(nonzero, power - low, 0)
    if int(shift.max()) > _MAX_SHIFT:
        return None
    whole = ints * torch.bitwise_left_shift(torch.ones_like(shift), shift)  # v = whole · 2^low
    g = torch.zeros_like(whole[..., 0])
    for j in range(per):
        g = torch.gcd(g, whole[..., j])
    g = torch.where(g == 0, 1, g)
    codes = whole // g[..., None]
    # a negative d (the K-quants allow one) may leave +128: take the other sign there
    flip = codes.amax(dim=2) > 127
    g = torch.where(flip, -g, g)
    codes = torch.where(flip[..., None], -codes, codes)
    if int(codes.min()) < -128 or int(codes.max()) > 127 or int(g.abs().max()) >= 1 << 24:
        return None
    d = torch.ldexp(g.to(torch.float64), low[..., 0].to(torch.float64)).to(torch.float32)
    codes8 = codes.to(torch.int8).reshape(n, groups)
    # the promise, checked: every value is d times its code, in fp32
    back = (d[..., None] * codes.to(torch.float32)).reshape(n, groups)
    if not torch.equal(back, values):
        return None
    return d, codes8


def header_blocks(superblock: int, offsets: bool) -> int:
    """64-byte blocks before a superblock's codes: ``d`` (and ``e``), then the scale codes
    (and the offset codes), ``superblock / 64`` blocks each."""
    kinds = 2 if offsets else 1
    return kinds + kinds * superblock // 64


def pack(
    codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, quads: bool = False
) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """``(qweight, row_scale, S)`` of six-bit ``codes # [N, K] int8`` (in -32 .. 31) with
    ``scale`` and ``offset # [N, K / 16] fp32`` in the superblock layout (``int8_gemv.cpp``):
    ``qweight # [Np / 16, K / S, H + 3 S / 16, 64] int8``, per tile and superblock of ``S``
    inputs ``H`` header blocks (:func:`header_blocks`; the offsets' only where some offset is
    not zero) and ``S / 16`` six-bit units; ``row_scale`` is all ones. ``S`` is the largest of
    256, 128 and 64 that divides ``K`` and over which the constants factor (:func:`factor`);
    None where none does. Rows are factored and written a chunk at a time (an LM head's
    temporaries stay small). ``quads``: the units in quad order, ``qweight # [Np / 16, K / S,
    H + 3 S / 16, 2, 32]`` (the same bytes a block, its two 32-byte halves the tile's two
    halves of 8 rows)."""
    n, k = codes.shape
    if scale.shape != (n, k // _SUB) or k % _SUB:
        return None
    offsets = bool((offset != 0).any())
    for superblock in (SUPERBLOCK, 128, 64):
        if k % superblock == 0:
            scaled = _factor_rows(scale.float(), superblock // _SUB)
            if scaled is None:
                continue
            shifted = _factor_rows(offset.float(), superblock // _SUB) if offsets else None
            if shifted is not None or not offsets:
                return _write(codes, scaled, shifted, superblock, quads)
    return None


def _factor_rows(values: torch.Tensor, per: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`factor` of ``values`` a chunk of rows at a time (None if any chunk fails)."""
    parts = []
    for start in range(0, values.shape[0], _ROW_CHUNK):
        part = factor(values[start : start + _ROW_CHUNK], per)
        if part is None:
            return None
        parts.append(part)
    if not parts:
        return None
    return torch.cat([d for d, _ in parts]), torch.cat([c for _, c in parts])


def _write(
    codes: torch.Tensor,
    scaled: tuple[torch.Tensor, torch.Tensor],
    shifted: tuple[torch.Tensor, torch.Tensor] | None,
    superblock: int,
    quads: bool,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    n, k = codes.shape
    per = superblock // _SUB
    parts = [scaled] if shifted is None else [scaled, shifted]
    kinds = len(parts)
    tiles, nsuper = -(-n // TILE_ROWS), k // superblock
    head = header_blocks(superblock, shifted is not None)
    qweight = huge_pages.empty((tiles, nsuper, head + 3 * per, BLOCK_BYTES), torch.int8)
    for start in range(0, n, _ROW_CHUNK):  # a multiple of 16: chunks are whole tiles
        stop = min(n, start + _ROW_CHUNK)
        pad = -(stop - start) % TILE_ROWS
        t0, t1 = start // TILE_ROWS, (stop + pad) // TILE_ROWS
        rows = torch.nn.functional.pad(codes[start:stop], (0, 0, 0, pad))
        units = qweight[t0:t1, :, head:].view(t1 - t0, nsuper, per, 3, BLOCK_BYTES)
        units.copy_(six_bit.pack_units(rows, quads).view(units.shape))
        for i, (d, c) in enumerate(parts):
            dd = torch.nn.functional.pad(d[start:stop], (0, 0, 0, pad))
            qweight[t0:t1, :, i].view(torch.float32).copy_(
                dd.view(t1 - t0, TILE_ROWS, nsuper).permute(0, 2, 1)
            )
            cc = torch.nn.functional.pad(c[start:stop], (0, 0, 0, pad))
            first = kinds + i * (superblock // 64)
            block = qweight[t0:t1, :, first : first + superblock // 64]
            block.view(t1 - t0, nsuper, per, 16).copy_(
                cc.view(t1 - t0, TILE_ROWS, nsuper, per).permute(0, 2, 3, 1)
            )
    if quads:
        qweight = qweight.view(*qweight.shape[:3], 2, BLOCK_BYTES // 2)
    return qweight, torch.ones(tiles * TILE_ROWS, dtype=torch.float32), superblock


def unpack(
    qweight: torch.Tensor, out_features: int, superblock: int = SUPERBLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack`: ``(codes # [N, K] int8, scale, offset # [N, K / 16]
    fp32)`` of a superblock ``qweight`` (either order), the constants ``d·code`` (exact)."""
    quads = qweight.dim() == 5
    if quads:
        qweight = qweight.reshape(*qweight.shape[:3], BLOCK_BYTES)
    tiles, nsuper, blocks, _ = qweight.shape
    per = superblock // _SUB
    head = blocks - 3 * per
    kinds = 2 if head == header_blocks(superblock, True) else 1
    if head != header_blocks(superblock, kinds == 2):
        raise ValueError(f"not a superblock qweight for superblock {superblock}: {blocks} blocks")
    units = qweight[:, :, head:].reshape(tiles, nsuper * per, 3, BLOCK_BYTES)
    byte_blocks = six_bit.unpack_units(units, quads)  # [T, K / 4, 64]: byte h*32 + c*8 + r
    k = nsuper * superblock
    codes = byte_blocks.view(tiles, k // 4, 2, 4, 8).permute(0, 2, 4, 1, 3)  # [T, h, r, B, c]
    codes = codes.reshape(tiles * TILE_ROWS, k)[:out_features]
    values = []
    for i in range(kinds):
        d = qweight[:, :, i].contiguous().view(torch.float32)  # [T, S, 16]
        first = kinds + i * (superblock // 64)
        c = qweight[:, :, first : first + superblock // 64].reshape(tiles, nsuper, per, 16)
        v = d[:, :, None, :] * c.to(torch.float32)  # [T, S, per, 16]
        values.append(v.permute(0, 3, 1, 2).reshape(tiles * TILE_ROWS, -1)[:out_features])
    offset = values[1] if kinds == 2 else torch.zeros_like(values[0])
    return codes.contiguous(), values[0].contiguous(), offset.contiguous()
