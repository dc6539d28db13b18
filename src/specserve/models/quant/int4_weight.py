"""The portable int4 weight layout and its quantiser (what the on-disk cache stores).

A leaf of ``models/``: the int4 layers (``layers.py``) and the native kernel's packing
(``models/native/int4_native.py``) both build on it without importing each other.

int4 here is asymmetric, one (scale, min) pair per group of ``group_size`` consecutive input
channels of an output channel: ``w ≈ q * scale + min``, ``q ∈ [0, 15]``. The per-group range
is clipped by a small search that minimises the group's squared error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_GROUP_SIZE = 64
_CLIP_RATIOS = (1.0, 0.94, 0.88, 0.82)
ROW_CHUNK = 8192  # rows quantised at a time (bounds the fp32 temporaries of a big LM head)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``# [N, K] uint8`` in 0..15 -> ``Int4Weight.nibbles # [N, K // 2] uint8``: byte j
    holds input channels 2j (low nibble) and 2j + 1 (high)."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


@dataclass
class Int4Weight:
    """Portable int4 weights (what the cache stores).

    Attributes:
        nibbles: ``# [N, K // 2] uint8``; byte j holds input channels 2j (low) and 2j+1 (high).
        scale: ``# [N, K // group_size] fp32``
        minimum: ``# [N, K // group_size] fp32``; ``w ≈ q * scale + minimum``.
        group_size: input channels per group.
    """

    nibbles: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor
    group_size: int

    def __post_init__(self) -> None:
        n, half_k = self.nibbles.shape
        if self.scale.shape != (n, 2 * half_k // self.group_size):
            raise ValueError(f"int4 scale shape {tuple(self.scale.shape)} does not fit {n=}")

    def codes(self) -> torch.Tensor:
        """Unpacked codes ``# [N, K] uint8`` in 0..15 (the inverse of :func:`pack_nibbles`)."""
        lo, hi = self.nibbles & 0xF, self.nibbles >> 4
        return torch.stack([lo, hi], dim=-1).view(self.nibbles.shape[0], -1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.nibbles.shape[0], self.nibbles.shape[1] * 2
        q = self.codes().view(n, k // self.group_size, self.group_size).float()
        w = q * self.scale[..., None] + self.minimum[..., None]
        return w.view(n, k).to(dtype)


def _quantize_int4_rows(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, ...]:
    n, k = w.shape
    g = w.view(n, k // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)  # [n, k/G]
    best_err = torch.full_like(lo, float("inf"))
    best_ratio = torch.ones_like(lo)
    for ratio in _CLIP_RATIOS:  # pick each group's clipping ratio by its squared error
        mn = lo * ratio
        scale = ((hi - lo) * (ratio / 15.0)).clamp(min=1e-10)
        q = (g - mn[..., None]).mul_(scale.reciprocal()[..., None]).round_().clamp_(0, 15)
        err = q.mul_(scale[..., None]).add_(mn[..., None]).sub_(g).square_().sum(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_ratio = torch.where(better, ratio, best_ratio)
    mn = lo * best_ratio
    scale = ((hi - lo) * (best_ratio / 15.0)).clamp(min=1e-10)
    q = (g - mn[..., None]).mul_(scale.reciprocal()[..., None]).round_().clamp_(0, 15)
    return q.to(torch.uint8).view(n, k), scale, mn


def quantize_int4(weight: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> Int4Weight:
    """``weight # [N, K]`` -> :class:`Int4Weight` (asymmetric groups, clipped ranges)."""
    k = weight.shape[1]
    if group_size < 2 or k % group_size != 0 or group_size % 2 != 0:
        raise ValueError(
            f"int4 needs an even group_size dividing in_features={k}, got {group_size}"
        )
    qs, scales, mins = [], [], []
    for chunk in weight.split(ROW_CHUNK):
        q, s, m = _quantize_int4_rows(chunk.float().cpu(), group_size)
        qs.append(q)
        scales.append(s)
        mins.append(m)
    q = torch.cat(qs)  # [N, K] codes
    return Int4Weight(pack_nibbles(q), torch.cat(scales), torch.cat(mins), group_size)
