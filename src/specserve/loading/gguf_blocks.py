"""GGUF block-quantised tensors as their stored codes and scales (no second quantisation).

llama.cpp's quantised types store, per block of 16 or 32 weights of a row, small integer
codes ``q`` and a scale (and for some types a minimum) derived from fp16 block constants:

============  =====  ================================  ==========================
type          group  weight                            here
============  =====  ================================  ==========================
Q4_0          32     ``d·(q − 8)``, q ∈ 0..15          int4: scale d, offset −8d
Q4_1          32     ``d·q + m``                       int4: scale d, offset m
Q4_K          32     ``(d·sc)·q − dmin·m``             int4: scale d·sc, offset −dmin·m
Q5_0          32     ``d·(q − 16)``, q ∈ 0..31         int8: code q − 16, scale d
Q5_1          32     ``d·q + m``                       int8: code q, scale d, offset m
Q5_K          32     ``(d·sc)·q − dmin·m``             int8: code q, scale d·sc, offset −dmin·m
Q6_K          16     ``(d·sc)·(q − 32)``, q ∈ 0..63    int8: code q − 32, scale d·sc
Q8_0          32     ``d·q``, q ∈ −128..127            int8: code q, scale d
============  =====  ================================  ==========================

(``sc``/``m`` are the K-quants' 6-bit (Q6_K: signed 8-bit) sub-block constants.) Every
scale and offset above is exact in fp32 (an fp16 times an integer of at most 8 bits), so
``code·scale + offset`` evaluated in fp32 is bit for bit what ``gguf.quants.dequantize``
(llama.cpp's reference dequantisation) returns: :func:`decode` loses nothing, and the tests
check that equality on every type. The int4 group of a block maps onto
:class:`~specserve.models.quant.int4_weight.Int4Weight` (``w = q·scale + minimum``), the
others onto :class:`~specserve.models.quant.int8_group.Int8GroupWeight` (signed byte codes,
``w = code·scale + offset``), each computed by its native kernel.

Other quantised types (Q2_K, Q3_K, the IQ types, ...) have no such mapping here;
:func:`decode` returns None for them and the caller dequantises (and says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from gguf import GGMLQuantizationType

Q = GGMLQuantizationType
QK_K = 256

# Bytes per block and weights per block of each type handled here.
_BLOCK = {
    Q.Q4_0: (18, 32),
    Q.Q4_1: (20, 32),
    Q.Q5_0: (22, 32),
    Q.Q5_1: (24, 32),
    Q.Q8_0: (34, 32),
    Q.Q4_K: (144, QK_K),
    Q.Q5_K: (176, QK_K),
    Q.Q6_K: (210, QK_K),
}
STORED_TYPES = frozenset(_BLOCK)
FLOAT_TYPES = frozenset({Q.F32, Q.F16, Q.BF16})


@dataclass
class StoredBlocks:
    """One tensor's stored codes and per-group constants, ``w = code·scale + offset``.

    Attributes:
        kind: ``int4`` (codes 0..15) or ``int8`` (signed byte codes).
        codes: ``# [N, K]`` uint8 (int4) or int8 (int8).
        scale: ``# [N, K // group_size]`` fp32.
        offset: ``# [N, K // group_size]`` fp32.
        group_size: consecutive input channels per (scale, offset).
        source_type: the GGUF type name, e.g. ``Q4_K``.
    """

    kind: Literal["int4", "int8"]
    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    group_size: int
    source_type: str

    def dequantize(self) -> torch.Tensor:
        """``# [N, K]`` fp32: ``code·scale + offset`` (equal to llama.cpp's dequantisation)."""
        n, k = self.codes.shape
        g = self.codes.view(n, k // self.group_size, self.group_size).float()
        return (g * self.scale[..., None] + self.offset[..., None]).view(n, k)


def _f16(raw: np.ndarray) -> np.ndarray:
    """``# [B, 2]`` uint8 -> ``# [B, 1]`` fp32 (little-endian fp16 values)."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, span: int) -> np.ndarray:
    """``qs # [B, c·span]`` -> codes ``# [B, 2·c·span]``: per run of ``span`` bytes, first
    their low nibbles, then their high nibbles (llama.cpp's element order)."""
    b = qs.shape[0]
    runs = qs.reshape(b, -1, 1, span)
    return np.concatenate([runs & 0x0F, runs >> 4], axis=2).reshape(b, -1)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes of a Q4_K/Q5_K block -> its 8 sub-block scales and mins (6 bits each):
    bytes 0-3 hold scales 0-3, bytes 4-7 mins 0-3 (low 6 bits each); scales / mins 4-7 take
    their low 4 bits from bytes 8-11 (low / high nibble) and their top 2 bits from the top
    bits of bytes 0-3 / 4-7."""
    b = packed.shape[0]
    p = packed.reshape(b, 3, 4)
    lo_s, lo_m, extra = p[:, 0], p[:, 1], p[:, 2]
    sc = np.concatenate([lo_s & 0x3F, (extra & 0x0F) | ((lo_s >> 2) & 0x30)], axis=1)
    mn = np.concatenate([lo_m & 0x3F, (extra >> 4) | ((lo_m >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _decode_blocks(
    blocks: np.ndarray, qtype: GGMLQuantizationType
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``blocks # [B, bytes]`` -> (codes ``# [B, W]``, scale, offset ``# [B, W // G]``, G)."""
    b = blocks.shape[0]
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        has_min = qtype in (Q.Q4_1, Q.Q5_1)
        d = _f16(blocks[:, 0:2])
        at = 4 if has_min else 2
        offset = _f16(blocks[:, 2:4]) if has_min else np.zeros_like(d)
        if qtype in (Q.Q5_0, Q.Q5_1):
            high = np.unpackbits(blocks[:, at : at + 4], axis=1, bitorder="little")  # [B, 32]
            q = _nibbles(blocks[:, at + 4 :], 16) | (high << 4)
            codes = q.astype(np.int16) - (16 if qtype == Q.Q5_0 else 0)
        else:
            q = _nibbles(blocks[:, at:], 16)
            codes = q.astype(np.int16)
            if qtype == Q.Q4_0:
                offset = -8.0 * d
        return codes, d, offset, 32
    if qtype == Q.Q8_0:
        d = _f16(blocks[:, 0:2])
        signed = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.int16)
        return signed, d, np.zeros_like(d), 32
    if qtype in (Q.Q4_K, Q.Q5_K):
        d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
        sc, mn = _k_scales(blocks[:, 4:16])
        if qtype == Q.Q4_K:
            q = _nibbles(blocks[:, 16:], 32)
        else:
            high = np.unpackbits(blocks[:, 16:48], axis=1, bitorder="little")  # [B, 256]
            # bit j of byte l belongs to element 32·j + l
            high = high.reshape(b, 32, 8).transpose(0, 2, 1).reshape(b, QK_K)
            q = _nibbles(blocks[:, 48:], 32) | (high << 4)
        return q.astype(np.int16), d * sc, -(dmin * mn), 32
    if qtype == Q.Q6_K:
        ql, qh = blocks[:, :128], blocks[:, 128:192]
        scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
        d = _f16(blocks[:, 208:210])
        low = _nibbles(ql, 64)  # [B, 256]: halves of 128, each 64 low then 64 high nibbles
        # qh: per half of 128 elements, 32 bytes; bits 2j..2j+1 of byte l -> element 32·j + l
        pairs = qh.reshape(b, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(
            1, 1, 4, 1
        )
        top = (pairs & 0x03).reshape(b, QK_K)
        q6 = (low | (top << 4)).astype(np.int16) - 32
        scale = d * scales
        return q6, scale, np.zeros_like(scale), 16
    raise ValueError(f"no stored-code mapping for GGUF type {qtype.name}")


def decode(
    raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]
) -> StoredBlocks | None:
    """The codes and constants of a 2-D GGUF tensor (``shape = (N, K)``, rows of ``K``
    weights), or None for a type without a mapping (see the module docstring).

    Raises:
        ValueError: ``raw`` has the wrong size for ``shape`` and ``qtype`` (truncated file?).
    """
    if qtype not in _BLOCK:
        return None
    n, k = shape
    block_bytes, block_weights = _BLOCK[qtype]
    if k % block_weights:
        raise ValueError(f"{qtype.name} rows need a multiple of {block_weights} weights, got {k}")
    blocks_total = n * k // block_weights
    data = np.asarray(raw).reshape(-1).view(np.uint8)
    if data.size != blocks_total * block_bytes:
        raise ValueError(
            f"{qtype.name} [{n}, {k}] needs {blocks_total * block_bytes} bytes, got {data.size}"
        )
    codes, scale, offset, group = _decode_blocks(data.reshape(blocks_total, block_bytes), qtype)
    kind: Literal["int4", "int8"] = "int4" if qtype in (Q.Q4_0, Q.Q4_1, Q.Q4_K) else "int8"
    code_dtype = np.uint8 if kind == "int4" else np.int8
    return StoredBlocks(
        kind=kind,
        codes=torch.from_numpy(codes.astype(code_dtype).reshape(n, k)),
        scale=torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32).reshape(n, -1)),
        offset=torch.from_numpy(np.ascontiguousarray(offset, dtype=np.float32).reshape(n, -1)),
        group_size=group,
        source_type=qtype.name,
    )
