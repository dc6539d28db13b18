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

from specserve.kv_cache.cache_tensors import KVCacheTensors
from specserve.models.decoder import Attention, AttentionMetadata, apply_rotary


class RowwiseAttention(nn.Module):
    """Same parameters and results as :class:`Attention` (decoder.py), but chunks of at most
    ``max_rows`` query tokens run one row at a time. The projection modules are the original
    ones, under the same names, so state dicts are unchanged."""

    def __init__(self, attn: Attention, max_rows: int = 16) -> None:
        super().__init__()
        self.layer_idx = attn.layer_idx
        self.num_heads = attn.num_heads
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim
        self.q_proj, self.k_proj, self.v_proj = attn.q_proj, attn.k_proj, attn.v_proj
        self.o_proj = attn.o_proj
        self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.max_rows = max_rows

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        mask: torch.Tensor,
        kv: KVCacheTensors,
    ) -> torch.Tensor:
        # Mirrors Attention.forward in decoder.py up to the SDPA call; keep the two in step.
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        kv.write(
            self.layer_idx,
            meta.slot_mapping.reshape(-1),
            k.reshape(b * t, *k.shape[2:]),
            v.reshape(b * t, *v.shape[2:]),
        )
        keys, values = kv.gather(self.layer_idx, meta.context_slots)  # [B, S, nkv, hd]
        q_t = q.transpose(1, 2)  # [B, nh, T, hd]
        k_t, v_t = keys.transpose(1, 2), values.transpose(1, 2)  # [B, nkv, S, hd]
        gqa = self.num_heads != self.num_kv_heads
        if 1 < t <= self.max_rows:
            rows = [
                F.scaled_dot_product_attention(
                    q_t[:, :, i : i + 1], k_t, v_t, attn_mask=mask[:, :, i : i + 1], enable_gqa=gqa
                )
                for i in range(t)
            ]
            out = torch.cat(rows, dim=2)  # [B, nh, T, hd]
        else:
            out = F.scaled_dot_product_attention(q_t, k_t, v_t, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
