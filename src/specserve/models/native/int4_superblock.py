"""Int4 codes with superblock constants: Q4_K's constants as the file stores them.

A Q4_K block holds, per row and superblock of 256 inputs, an fp16 ``d`` and ``dmin`` and per
sub-group of 32 a six-bit scale code ``sc`` and minimum code ``m``: the sub-group's weights
are ``d·sc·q − dmin·m``. :func:`~specserve.models.native.int4_native.pack` writes per-group
fp16 constants instead (a scale and a midpoint per sub-group and row: 5 bits a weight, and
``d·sc`` rounded to fp16); this layout keeps the file's 4.5 bits a weight and its numbers
exactly, so a decode step reads the file's bytes (``int4_gemv.cpp``'s ``run_block_super``,
AVX-512 BF16 only).

:func:`pack` recovers the form from any per-group constants that have it (the products
``d·sc`` are exact in fp32; :func:`superblock.factor` finds the common factor) and returns
None where they do not, so callers fall back to the per-group layout; :func:`preferred` says
where the kernel reads it.
"""

from __future__ import annotations

import torch

from specserve.models.native import huge_pages, int4_native, six_bit, superblock
from specserve.models.native.tile_stream import BLOCK_BYTES, TILE_ROWS
from specserve.models.quant.int4_weight import Int4Weight

__all__ = ["GROUP", "has_form", "pack", "packed_or_none", "preferred", "unpack"]

SUPERBLOCK = int4_native.SUPERBLOCK  # inputs a superblock (256, the K-quants')
GROUP = int4_native.SUPER_GROUP  # inputs a sub-group (32, Q4_K's)
_PER = SUPERBLOCK // GROUP  # sub-groups a superblock
_HEAD = int4_native.SUPER_HEADER_BLOCKS  # d and e (fp16), one six-bit unit of codes
_CODE_MAX = 63  # six-bit codes, unsigned
_ROW_CHUNK = 4096  # rows factored and packed at a time (a multiple of 16)


def preferred() -> bool:
    """Whether Q4_K-form weights are packed with superblock constants: where
    :func:`superblock.preferred` says the six-bit codes' superblocks are in their bf16-pair
    order (AVX-512 BW, VBMI, BF16 and GFNI, the AMX tiles off,
    ``SPECSERVE_SUPERBLOCK_CONSTANTS`` not ``0``; not the AVX2 hosts' quad order, where the
    int4 kernel has no superblock form). The int4 kernel itself needs only AVX-512 BF16 and
    GFNI; one condition keeps a model's two superblock layouts together. Read on every
    call."""
    return superblock.preferred() and not superblock.quad_order()


def packed_or_none(weight: Int4Weight) -> int4_native.Int4Packed | None:
    """``weight`` packed with superblock constants where :func:`preferred` and its constants
    have the form (:func:`pack`), else None (pack it per group)."""
    if weight.group_size != GROUP or not preferred():
        return None
    codes = weight.codes().cpu()
    qweight = pack(codes, weight.scale.detach().cpu(), weight.minimum.detach().cpu())
    if qweight is None:
        return None
    row_scale = torch.ones(qweight.shape[0] * TILE_ROWS, dtype=torch.float32)
    return int4_native.Int4Packed(
        qweight, torch.empty(0, dtype=torch.float16), row_scale, codes.shape[0], GROUP
    )


def has_form(weight: Int4Weight) -> bool:
    """Whether ``weight``'s constants have Q4_K's superblock form (what :func:`pack` needs:
    sub-groups of 32, ``K`` a multiple of 256, every superblock's scales and minimums six-bit
    codes over an fp16 factor), whatever layout this CPU's kernel reads: a GGUF file's Q4_K
    tensors have it, its Q4_0 / Q4_1 ones in general not."""
    n, k = weight.nibbles.shape[0], 2 * weight.nibbles.shape[1]
    if weight.group_size != GROUP or k % SUPERBLOCK:
        return False
    return all(
        _half_factor(values[start : start + _ROW_CHUNK].detach().cpu().float()) is not None
        for values in (weight.scale, weight.minimum)
        for start in range(0, n, _ROW_CHUNK)
    )


def pack(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor | None:
    """The superblock layout of int4 ``codes # [N, K] uint8`` (0 .. 15) with ``scale`` and
    ``minimum # [N, K / 32] fp32`` (``w = code·scale + minimum``):
    ``qweight # [Np / 16, K / 256, 36, 64] uint8``, per tile and superblock of 256 inputs
    one block of fp16 ``d`` then ``e`` (16 rows each), one six-bit unit
    (:func:`six_bit.pack_units`'s layout) whose slot ``j`` of a row is its sub-group ``j``'s
    scale code and slot ``8 + j`` its minimum code (0 .. 63), then the 32 code blocks
    (:func:`int4_native.pack_code_blocks`). The weights are exactly those given. None where
    ``K`` is not a multiple of 256 or some superblock's constants have no such form (codes of
    one sign within 0 .. 63 over an fp16 factor)."""
    n, k = codes.shape
    if k % SUPERBLOCK or scale.shape != (n, k // GROUP) or minimum.shape != scale.shape:
        return None
    tiles, nsuper = -(-n // TILE_ROWS), k // SUPERBLOCK
    qweight = huge_pages.empty((tiles, nsuper, int4_native.SUPER_BLOCKS, BLOCK_BYTES), torch.uint8)
    for start in range(0, n, _ROW_CHUNK):  # a multiple of 16: chunks are whole tiles
        stop = min(n, start + _ROW_CHUNK)
        pad = -(stop - start) % TILE_ROWS
        parts = []
        for values in (scale[start:stop], minimum[start:stop]):
            part = _half_factor(values.float())
            if part is None:
                return None
            parts.append([torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in part])
        (d, sc), (e, mo) = parts
        t0, t1 = start // TILE_ROWS, (stop + pad) // TILE_ROWS
        head = qweight[t0:t1, :, 0].view(torch.float16).view(t1 - t0, nsuper, 2, TILE_ROWS)
        for i, f in enumerate((d, e)):
            head[:, :, i].copy_(f.view(t1 - t0, TILE_ROWS, nsuper).permute(0, 2, 1))
        # [rows, S, 16] slots: the eight scale codes, then the eight minimum codes
        slots = torch.cat([sc.view(-1, nsuper, _PER), mo.view(-1, nsuper, _PER)], dim=2)
        signed = (slots.to(torch.int16) - 32).to(torch.int8).view(-1, nsuper * 16)
        unit = six_bit.pack_units(signed).view(torch.uint8)  # [T, S, 3, 64]
        qweight[t0:t1, :, 1:_HEAD].copy_(unit)
        rows = torch.nn.functional.pad(codes[start:stop], (0, 0, 0, pad))
        code_blocks = int4_native.pack_code_blocks(rows)
        qweight[t0:t1, :, _HEAD:].copy_(code_blocks.view(t1 - t0, nsuper, -1, BLOCK_BYTES))
    return qweight


def _half_factor(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``values # [N, G]`` (``G`` a multiple of 8) as fp16 ``d # [N, G / 8]`` times codes
    ``# [N, G] uint8`` in 0 .. 63, exactly, or None. :func:`superblock.factor` gives the
    smallest codes; where its ``d`` is no fp16 (the codes of a superblock share a factor
    ``f``: its ``d`` is the file's times ``f``), the codes times the smallest ``f`` that makes
    ``d / f`` one are taken."""
    found = superblock.factor(values, _PER)
    if found is None:
        return None
    d, codes8 = found
    codes = codes8.view(d.shape[0], d.shape[1], _PER).to(torch.int32)
    flip = codes.amax(dim=2) <= 0  # codes of one sign per superblock: make them non-negative
    d = torch.where(flip, -d, d)
    codes = torch.where(flip[..., None], -codes, codes)
    if codes.numel() and int(codes.min()) < 0:
        return None
    top = codes.amax(dim=2)
    out = torch.zeros_like(d)
    times = torch.zeros_like(top)
    for f in range(1, _CODE_MAX + 1):
        cand = d / f
        fits = (cand.half().float() == cand) & (cand * f == d) & (top * f <= _CODE_MAX)
        take = fits & (times == 0)
        out = torch.where(take, cand, out)
        times = torch.where(take, f, times)
        if bool((times > 0).all()):
            break
    if not bool((times > 0).all()):
        return None
    codes = codes * times[..., None]
    back = (out[..., None] * codes.to(torch.float32)).reshape(values.shape)
    if not torch.equal(back, values):  # the promise, checked
        return None
    return out.half(), codes.to(torch.uint8).reshape(values.shape)


def unpack(
    qweight: torch.Tensor, out_features: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack`: ``(codes # [N, K] uint8, scale, minimum
    # [N, K / 32] fp32)``, the constants ``d·code`` (exact)."""
    tiles, nsuper, blocks, _ = qweight.shape
    if qweight.dtype != torch.uint8 or blocks != int4_native.SUPER_BLOCKS:
        raise ValueError(f"not an int4 superblock qweight: {qweight.dtype} {tuple(qweight.shape)}")
    code_blocks = qweight[:, :, _HEAD:].reshape(tiles, -1, BLOCK_BYTES)
    codes = int4_native.unpack_code_blocks(code_blocks)[:out_features]
    head = qweight[:, :, 0].contiguous().view(torch.float16).view(tiles, nsuper, 2, TILE_ROWS)
    unit = qweight[:, :, 1:_HEAD].contiguous().view(torch.int8)
    # six_bit.unpack_units writes the slots in the byte-code layout: [T, S, b, h, c, r]
    u = six_bit.unpack_units(unit).view(tiles, nsuper, 4, 2, 4, 8)
    slots = u.permute(0, 1, 2, 4, 3, 5).reshape(tiles, nsuper, 16, TILE_ROWS).to(torch.int32)
    slots = slots + 32
    out = []
    for i in range(2):
        f = head[:, :, i].float()  # [T, S, rows]
        v = f[:, :, None, :] * slots[:, :, _PER * i : _PER * (i + 1)].float()  # [T, S, j, rows]
        out.append(v.permute(0, 3, 1, 2).reshape(tiles * TILE_ROWS, -1)[:out_features])
    return codes.contiguous(), out[0].contiguous(), out[1].contiguous()
