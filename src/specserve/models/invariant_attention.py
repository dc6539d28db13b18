"""Attention that computes each query row of a short chunk on its own, so a k + 1-token
verification gives every token the numbers a 1-token decode step gives it.

Why: the CPU flash-attention kernel multiplies a block of query rows against the keys in
one GEMM; with head_dim 64-128 and bf16 its accumulation order depends on how many rows the
block has, so row i of a 5-row verification can differ in the last bit from the same row
decoded alone — enough to flip a near-tie (measured: 10 of 70 rows differ at head_dim 128).
Here each row of a chunk of at most ``max_rows`` rows (a decode step is a chunk of one) runs
the same few fixed-shape fp32 matmuls, T of them per layer (T = k + 1 <= max_rows); longer
chunks (prefill) take the batched kernel.

Used together with :class:`specserve.models.fast_path.InvariantContextForward`, which fixes
the other source of difference (the reduction length over the context).
"""

from __future__ import annotations

import torch
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
        """As :meth:`Attention.attend`; chunks of at most ``max_rows`` rows (a decode step
        included) run one query row at a time through :meth:`attend_row`."""
        t = q.shape[2]
        if t > self.max_rows:
            return super().attend(q, k, v, mask)
        kt = k.float().transpose(-1, -2)  # [B, nkv, hd, S], shared by the rows
        vf = v.float()
        rows = [
            self.attend_row(q[:, :, i : i + 1], kt, vf, mask[:, :, i : i + 1]) for i in range(t)
        ]
        return rows[0] if t == 1 else torch.cat(rows, dim=2)  # [B, nh, T, hd]

    def attend_row(
        self, q: torch.Tensor, kt: torch.Tensor, vf: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention of one query row ``q # [B, nh, 1, hd]`` over ``kt # [B, nkv, hd, S]``
        (keys, fp32, transposed) and ``vf # [B, nkv, S, hd]`` (fp32) with ``mask # [B, 1, 1,
        S]``; in fp32, cast back to ``q``'s dtype.

        Every row runs the same fixed-shape fp32 matmuls whatever the chunk, so a row gets
        the bits a decode step gets. Not the CPU flash kernel: for one query row it costs
        ~0.4 ms per layer at a 256-slot context, several times these few small ops.
        """
        b, nh, _, hd = q.shape
        nkv = kt.shape[1]
        qg = q.reshape(b, nkv, nh // nkv, hd).float()  # q head i uses kv head i // (nh / nkv)
        scores = torch.matmul(qg, kt).mul_(hd**-0.5)  # [B, nkv, g, S]
        scores.masked_fill_(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), vf)  # [B, nkv, g, hd]
        return out.reshape(b, nh, 1, hd).to(q.dtype)
