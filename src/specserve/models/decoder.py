"""Decoder-only transformer for the Llama, Qwen2 and Qwen3 families.

Parameter names follow the Hugging Face checkpoints (``model.layers.0.self_attn.q_proj.weight``)
so a safetensors state dict loads without renaming; GGUF tensors are mapped onto these names by
``loading/gguf_loader.py``.

Attention reads and writes a paged KV cache through :class:`AttentionMetadata`. The same
forward serves prefill (T = prompt chunk), decode (T = 1) and speculative verification
(T = k + 1), batched with padding: every query token carries its absolute position, and may
attend to context positions ``0..position`` of its own sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specserve.models.arch import ArchConfig
from specserve.models.cache_tensors import KVCacheTensors
from specserve.models.norm_rope import RMSNorm, RotaryEmbedding, apply_rotary, final_norm

# Query rows per sequence up to which a forward is "short" (decode steps, k + 1-token
# verifies): attention runs row by row, and an installed layer runner takes the forward.
SHORT_FORWARD_ROWS = 16

# Runs every decoder layer of a short forward (see DecoderLM.layer_runner):
# (model, x # [B, T, hidden], cos, sin # [B, T, head_dim], meta, kv, captured) -> hidden
# before the norm, in the model's dtype or fp32; the residual stream entering each layer in
# ``model.capture_layers`` is appended to ``captured`` (a list, or None: nothing captured).
LayerRunner = Callable[
    [
        "DecoderLM",
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        "AttentionMetadata",
        KVCacheTensors,
        "list[torch.Tensor] | None",
    ],
    torch.Tensor,
]
# Computes the logits (see DecoderLM.logits_runner): (model, hidden # [..., hidden]) -> fp32.
LogitsRunner = Callable[["DecoderLM", torch.Tensor], torch.Tensor]


@dataclass
class AttentionMetadata:
    """Where a batch's tokens sit in the KV cache.

    Attributes:
        positions: ``# [B, T]`` absolute position of each query token (padding: 0).
        slot_mapping: ``# [B, T]`` cache slot the token's K/V is written to (padding: scratch).
        context_slots: ``# [B, S]`` slot of context position j of each sequence, j < S
            (padding: scratch). Must cover every position up to the largest query position.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    context_slots: torch.Tensor

    def rows(self, start: int, stop: int) -> AttentionMetadata:
        """The query tokens ``[start, stop)`` of every sequence, with the same context."""
        return AttentionMetadata(
            self.positions[:, start:stop], self.slot_mapping[:, start:stop], self.context_slots
        )

    def attention_mask(self) -> torch.Tensor:
        """Boolean ``# [B, 1, T, S]`` mask: key j is visible to a query at position p iff j <= p."""
        s = self.context_slots.shape[1]
        key_pos = torch.arange(s, device=self.positions.device)
        return key_pos.view(1, 1, 1, s) <= self.positions.unsqueeze(1).unsqueeze(-1)


class Attention(nn.Module):
    # Query rows up to which attention runs row by row (see attend): the decode / verify
    # chunk sizes, the same bound as a layer runner's.
    max_rows = SHORT_FORWARD_ROWS

    def __init__(self, cfg: ArchConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_dim = cfg.num_heads * cfg.head_dim
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        # Set by weight-only quantisation (models/quant/quantize.py): q, k and v rows in one module,
        # one matmul instead of three; q_proj/k_proj/v_proj are then None.
        self.qkv_proj: nn.Module | None = None
        self.qkv_sizes = (q_dim, kv_dim, kv_dim)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        mask: torch.Tensor,
        kv: KVCacheTensors,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q, keys, values = self.project_and_cache(x, cos, sin, meta, kv)
        out = self.attend(
            q.transpose(1, 2),  # [B, nh, T, hd]
            keys.transpose(1, 2),  # [B, nkv, S, hd]
            values.transpose(1, 2),
            mask,
        )  # [B, nh, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def project_and_cache(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCacheTensors,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project ``x # [B, T, hidden]`` to queries, keys and values, apply the optional
        q/k norms and RoPE, write this chunk's keys and values to the KV cache and gather the
        request's whole context back.

        Returns:
            ``(q # [B, T, nh, hd], keys # [B, S, nkv, hd], values # [B, S, nkv, hd])``.
        """
        b, t, _ = x.shape
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None and self.q_norm is None:
            # q and k heads sit side by side in the fused output: one RoPE call for both
            # (the same elementwise ops per element, half the dispatches).
            qkv = self.qkv_proj(x)
            qk = apply_rotary(qkv[..., : (nh + nkv) * hd].view(b, t, nh + nkv, hd), cos, sin)
            q, k = qk.split((nh, nkv), dim=2)
            v = qkv[..., (nh + nkv) * hd :].view(b, t, nkv, hd)
        else:
            if self.qkv_proj is not None:
                q, k, v = self.qkv_proj(x).split(self.qkv_sizes, dim=-1)
            else:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            q = q.view(b, t, nh, hd)
            k = k.view(b, t, nkv, hd)
            v = v.view(b, t, nkv, hd)
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
        return q, keys, values

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Scaled dot-product attention of ``q # [B, nh, T, hd]`` over
        ``k, v # [B, nkv, S, hd]``; returns ``[B, nh, T, hd]``.

        Chunks of at most ``max_rows`` query rows (decode steps, k + 1-token verifies) run one
        row at a time through :func:`attend_one_row`: every row runs the same fixed-shape fp32
        ops whatever the chunk, so a verified token gets the attention output a decode step
        gives it. Longer chunks (prefill) take the fused kernel, whose rows depend on the
        block of rows around them.
        """
        t = q.shape[2]
        if t <= self.max_rows:
            kt = k.float().transpose(-1, -2)  # [B, nkv, hd, S], shared by the rows
            vf = v.float()
            hidden = ~mask  # once per chunk, not per row
            rows = [
                attend_one_row(q[:, :, i : i + 1], kt, vf, hidden[:, :, i : i + 1])
                for i in range(t)
            ]
            return rows[0] if t == 1 else torch.cat(rows, dim=2)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads
        )


def attend_one_row(
    q: torch.Tensor, kt: torch.Tensor, vf: torch.Tensor, hidden: torch.Tensor
) -> torch.Tensor:
    """Attention of one query row per sequence, in fp32, cast back to ``q``'s dtype.

    Args:
        q: ``# [B, nh, 1, hd]`` queries (query head i reads kv head i // (nh / nkv)).
        kt: ``# [B, nkv, hd, S]`` keys, fp32, transposed.
        vf: ``# [B, nkv, S, hd]`` values, fp32.
        hidden: ``# [B, 1, 1, S]`` True where a key is not visible (the inverted mask).

    A handful of small fixed-shape ops: on CPU the fused flash kernel costs ~0.2-0.4 ms per
    layer for a single query row, several times this, and a decode step is dispatch bound.
    """
    b, nh, _, hd = q.shape
    nkv = kt.shape[1]
    qg = q.reshape(b, nkv, nh // nkv, hd).float()
    scores = torch.matmul(qg, kt).mul_(hd**-0.5)  # [B, nkv, g, S]
    scores.masked_fill_(hidden, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), vf)  # [B, nkv, g, hd]
    return out.reshape(b, nh, 1, hd).to(q.dtype)


class MLP(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        # Set by weight-only quantisation: gate and up rows in one module (see Attention).
        self.gate_up_proj: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # This layer's arguments of a native layer op, set by the runner that uses them
        # (models/native/fused_layer.py).
        self.fused: Any = None

    def forward(self, x, cos, sin, meta, mask, kv):  # type: ignore[no-untyped-def]
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, mask, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderLM(nn.Module):
    """The language model: ``forward`` gives hidden states, ``compute_logits`` vocabulary scores.

    Splitting the two lets the runner compute logits only for the rows it samples from
    (the last prompt token at prefill, the k + 1 verified positions at verification).
    """

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Every forward runs all layers through this runner when one is installed, a prompt in
        # chunks of prompt_chunk_rows tokens (models/native/fused_layer.py: enable installs one
        # native op per layer and picks the chunk, which sets how often weights are read).
        self.layer_runner: LayerRunner | None = None
        self.prompt_chunk_rows = SHORT_FORWARD_ROWS
        # compute_logits runs through this when installed (fused_layer.py: the native bf16 head).
        self.logits_runner: LogitsRunner | None = None
        # Hidden states recorded by every forward for a proposer that drafts from them
        # (EAGLE, Medusa): indices in Hugging Face's ``hidden_states`` numbering, index i <
        # num_layers the residual stream entering layer i, index num_layers the final normed
        # output. Empty: nothing is recorded (see forward_with_hidden).
        self.capture_layers: tuple[int, ...] = ()
        # An inference engine: no parameter ever needs a gradient.
        self.requires_grad_(False)

    @property
    def fused_layers(self) -> bool:
        """Whether forwards run through a layer runner (see :attr:`layer_runner`)."""
        return self.layer_runner is not None

    @property
    def dtype(self) -> torch.dtype:
        # The final norm, not the embedding: a weight-only quantised model
        # (models/quant/quantize.py) stores the embedding as int8 while activations keep
        # this dtype.
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, kv: KVCacheTensors
    ) -> torch.Tensor:
        """Run the decoder over a padded batch, writing its K/V into ``kv``.

        With a :attr:`layer_runner` installed (models/native/fused_layer.py), every forward
        runs the layers through it, a prompt in chunks of :attr:`prompt_chunk_rows` tokens.

        Args:
            input_ids: ``# [B, T]`` token ids (padding: any valid id).
            meta: positions and cache slots of those tokens.
            kv: the cache this model owns.
        Returns:
            final hidden states ``# [B, T, hidden_size]``.
        """
        return self._run(input_ids, meta, kv, None)

    def forward_with_hidden(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, kv: KVCacheTensors
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`, also returning the hidden states named by :attr:`capture_layers`
        side by side: ``# [B, T, len(capture_layers) * hidden_size]``, in the order of
        ``capture_layers``. The same forward, nothing run twice."""
        if not self.capture_layers:
            raise ValueError("forward_with_hidden needs capture_layers")
        captured: list[torch.Tensor] = []
        hidden = self._run(input_ids, meta, kv, captured)
        return hidden, torch.cat(captured, dim=-1) if len(captured) > 1 else captured[0]

    def _run(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCacheTensors,
        captured: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        assert input_ids.shape == meta.positions.shape == meta.slot_mapping.shape
        n_layers = self.cfg.num_layers
        inner = (
            None if captured is None else sorted({i for i in self.capture_layers if i < n_layers})
        )
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(meta.positions, x.dtype)
        if self.layer_runner is not None:
            # A prompt runs in chunks of prompt_chunk_rows tokens, each attending to the cache
            # the earlier ones wrote: the runner's rows do not depend on the grouping, so each
            # prompt row gets, bit for bit, what a decode or verify step would give it.
            t, n = input_ids.shape[1], self.prompt_chunk_rows
            chunks, per_chunk = [], []
            for s in range(0, t, n):
                got: list[torch.Tensor] | None = [] if inner else None
                chunks.append(
                    self.layer_runner(
                        self, x[:, s : s + n], cos[:, s : s + n], sin[:, s : s + n],
                        meta.rows(s, s + n), kv, got,
                    )
                )  # fmt: skip
                per_chunk.append(got or [])
            hidden = chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=1)
            out = final_norm(self.model.norm, hidden)  # fp32 or the model's dtype
            layer_states = [
                parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
                for parts in zip(*per_chunk, strict=True)
            ]
        else:
            cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # once, not twice in every layer
            mask = meta.attention_mask()
            layer_states = []
            for i, layer in enumerate(self.model.layers):
                if inner and i in inner:
                    layer_states.append(x)
                x = layer(x, cos, sin, meta, mask, kv)
            out = self.model.norm(x)
        if captured is not None:
            by_index = dict(zip(inner or [], layer_states, strict=True))
            by_index[n_layers] = out
            captured.extend(by_index[i] for i in self.capture_layers)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden # [..., hidden_size]`` -> logits ``# [..., vocab_size]`` in fp32."""
        if self.logits_runner is not None:
            return self.logits_runner(self, hidden)
        return self.lm_head(hidden).float()

    def make_kv_cache(self, num_blocks: int, block_size: int) -> KVCacheTensors:
        return KVCacheTensors(
            num_layers=self.cfg.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
