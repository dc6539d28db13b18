"""Attention that computes each query row of a short chunk on its own, so a k + 1-token
verification gives every token the numbers a 1-token decode step gives it.

Why: the CPU flash-attention kernel multiplies a block of query rows against the keys in
one GEMM; with head_dim 64-128 and bf16 its accumulation order depends on how many rows the
block has, so row i of a 5-row verification can differ in the last bit from the same row
decoded alone — enough to flip a near-tie (measured: 10 of 70 rows differ at head_dim 128).
Running one SDPA call per row costs T small calls per layer (T = k + 1 <= max_rows), which is
cheap next to reading the weights; longer chunks (prefill) take the batched kernel.

Used together with :class:`specserve.models.fast_path.InvariantContextForward`, which fixes
the other source of difference (the reduction length over the context).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specserve.models.decoder import Attention


class RowwiseAttention(Attention):
    """Same parameters and results as :class:`Attention` (decoder.py), but chunks of at most
    ``max_rows`` query tokens run one row at a time. The projection modules are the original
    ones, under the same names, so state dicts are unchanged."""

    def __init__(self, attn: Attention, max_rows: int = 16) -> None:
        # Adopts ``attn``'s modules instead of building new ones, so Attention.__init__
        # is skipped on purpose.
        nn.Module.__init__(self)
        self.layer_idx = attn.layer_idx
        self.num_heads = attn.num_heads
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim
        self.q_proj, self.k_proj, self.v_proj = attn.q_proj, attn.k_proj, attn.v_proj
        self.qkv_proj, self.qkv_sizes = attn.qkv_proj, attn.qkv_sizes
        self.o_proj = attn.o_proj
        self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.max_rows = max_rows

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """As :meth:`Attention.attend`, one query row at a time for short chunks."""
        t = q.shape[2]
        if not 1 < t <= self.max_rows:
            return super().attend(q, k, v, mask)
        gqa = self.num_heads != self.num_kv_heads
        rows = [
            F.scaled_dot_product_attention(
                q[:, :, i : i + 1], k, v, attn_mask=mask[:, :, i : i + 1], enable_gqa=gqa
            )
            for i in range(t)
        ]
        return torch.cat(rows, dim=2)  # [B, nh, T, hd]
