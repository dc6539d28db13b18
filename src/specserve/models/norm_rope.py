"""The two small building blocks every decoder and draft head shares: RMSNorm and RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the reference implementations, then cast back. One
        # ``rms_norm`` call instead of five elementwise ops: the decode step is dispatch bound.
        weight: torch.Tensor = self.weight
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def final_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` for a residual stream in the norm's dtype; for an fp32 stream under a
    lower-precision norm (the fused layers', models/native/fused_layer.py), computed in fp32
    and rounded once to the norm's dtype, as those layers round their own norms."""
    if x.dtype == norm.weight.dtype:
        return norm(x)
    return _norm_rounded_once(norm, x)


# Eager even inside ``torch.compile``: inductor reorders the fp32 reduction, which moves the
# rounding after it, and a compiled forward must give the bits the eager one gives.
@torch.compiler.disable
def _norm_rounded_once(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    weight: torch.Tensor = norm.weight
    return (weight.float() * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.eps)).to(weight.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE in the "rotate half" layout used by Hugging Face checkpoints (Su et al., 2021)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``# [B, T, head_dim]`` for ``positions # [B, T]``."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x # [B, T, H, hd]``, ``cos/sin # [B, T, 1, hd]`` (one head axis, broadcast)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
