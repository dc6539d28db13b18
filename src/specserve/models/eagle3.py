"""The EAGLE-3 draft head: one decoder layer that drafts from the target's own hidden states.

EAGLE-3 (Li et al., 2025) drafts token t + 2 from two inputs at position t: the target's
hidden states of token t at a low, a middle and a high layer (concatenated and projected to
the head's width by ``fc``) and the embedding of token t + 1 (known: the target sampled it).
One decoder layer whose attention reads 2 × hidden inputs (the normed embedding beside the
normed hidden state) mixes them with the head's own earlier positions; a final norm and the
head's LM head over a reduced *draft vocabulary* give the logits, and ``d2t`` maps a draft id
to the target id (``target = draft + d2t[draft]``, the offsets the ``speculators`` format
stores). To draft further, the layer's output before the final norm stands in for the
target's hidden state of the drafted position, and the drafted token's embedding is fed next.

Parameter names follow the ``speculators`` Eagle3 checkpoint layout (``fc.weight``,
``layers.0.self_attn.q_proj.weight``, ``layers.0.hidden_norm.weight``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ``t2d``), so a head trained here loads in vLLM and the other way
round. The embedding is the target's own (EAGLE-3 keeps it frozen): the proposer embeds with
the target, and a head directory may leave it out (a head that ships ``embed_tokens`` uses
its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specserve.models.norm_rope import RMSNorm, RotaryEmbedding, apply_rotary


@dataclass(frozen=True)
class Eagle3Config:
    """Shapes of an EAGLE-3 head and what it needs from its target.

    Attributes:
        hidden_size: the head's width (the target's, for every public EAGLE-3 head).
        intermediate_size: the SwiGLU inner width of its one layer.
        num_heads / num_kv_heads / head_dim: its attention.
        rope_theta / rms_norm_eps: as in the target's family.
        target_hidden_size: the width of each captured target hidden state.
        aux_layer_ids: the target hidden states it reads, in Hugging Face ``hidden_states``
            numbering (the residual stream entering layer i).
        target_vocab_size: the target's vocabulary (the embedding's rows, ``t2d``'s length).
        draft_vocab_size: rows of the head's LM head (``d2t``'s length).
        norm_before_residual: the residual of the attention is the normed hidden state
            (a ``speculators`` option; off in the original EAGLE-3).
        norm_output: the next draft step is fed the output after the final norm instead of
            before it (``speculators``' "Eagle 3.1" option).
        attention_bias: q/k/v projections carry a bias.
        own_embedding: the head carries its own embedding table (``embed_tokens``) instead
            of using the target's.
    """

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    target_vocab_size: int
    draft_vocab_size: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    norm_before_residual: bool = False
    norm_output: bool = False
    attention_bias: bool = False
    own_embedding: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if not self.aux_layer_ids:
            raise ValueError("an EAGLE-3 head reads at least one target hidden state")
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError(
                f"draft_vocab_size {self.draft_vocab_size} must be in "
                f"[1, target_vocab_size = {self.target_vocab_size}]"
            )


@dataclass
class HeadKV:
    """One sequence's keys and values in the head's layer, positions ``base ..``."""

    k: torch.Tensor  # [capacity, nkv, hd]
    v: torch.Tensor
    base: int = 0
    length: int = 0

    @property
    def end(self) -> int:
        """The position after the last cached one."""
        return self.base + self.length

    def truncate(self, end_position: int) -> None:
        self.length = max(0, min(self.length, end_position - self.base))

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """``k, v # [T, nkv, hd]`` at positions ``end ..``."""
        need = self.length + k.shape[0]
        if need > self.k.shape[0]:
            cap = max(need, 2 * self.k.shape[0])
            grown_k = self.k.new_empty((cap, *self.k.shape[1:]))
            grown_v = self.v.new_empty((cap, *self.v.shape[1:]))
            grown_k[: self.length] = self.k[: self.length]
            grown_v[: self.length] = self.v[: self.length]
            self.k, self.v = grown_k, grown_v
        self.k[self.length : need] = k
        self.v[self.length : need] = v
        self.length = need


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        nh, nkv, hd, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        cache: HeadKV | None,
    ) -> torch.Tensor:
        """``x # [B, T, 2 * hidden]``; with ``cache`` (B = 1) this chunk's K/V is appended
        and attention reads every cached position, else it is causal within the chunk."""
        b, t, _ = x.shape
        nh, nkv, hd = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        q = apply_rotary(self.q_proj(x).view(b, t, nh, hd), cos, sin)
        k = apply_rotary(self.k_proj(x).view(b, t, nkv, hd), cos, sin)
        v = self.v_proj(x).view(b, t, nkv, hd)
        if cache is not None:
            assert b == 1
            cache.append(k[0], v[0])
            k = cache.k[None, : cache.length]
            v = cache.v[None, : cache.length]
            key_pos = torch.arange(cache.base, cache.end, device=x.device)
            mask = key_pos.view(1, 1, 1, -1) <= positions.view(b, 1, t, 1)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                attn_mask=mask, enable_gqa=nh != nkv,
            )  # fmt: skip
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                is_causal=True, enable_gqa=nh != nkv,
            )  # fmt: skip
        return self.o_proj(out.transpose(1, 2).reshape(b, t, nh * hd))


class Eagle3MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    """The head's decoder layer: attention over [norm(embedding), norm(hidden)], then MLP."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = Eagle3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        cache: HeadKV | None,
    ) -> torch.Tensor:
        """The layer's output before the final norm (what the next draft step feeds back)."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.cfg.norm_before_residual else hidden
        x = torch.cat((self.input_layernorm(embeds), normed), dim=-1)
        x = residual + self.self_attn(x, cos, sin, positions, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    """An EAGLE-3 head (see the module docstring). Inference and training share ``forward``."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        n_in = len(cfg.aux_layer_ids) * cfg.target_hidden_size
        self.fc = nn.Linear(n_in, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(cfg)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.embed_tokens = (
            nn.Embedding(cfg.target_vocab_size, cfg.hidden_size) if cfg.own_embedding else None
        )
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.d2t: torch.Tensor
        self.t2d: torch.Tensor
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.target_vocab_size, dtype=torch.bool))

    def set_vocab_map(self, draft_to_target: torch.Tensor) -> None:
        """Set the draft vocabulary from the target ids it keeps (``# [draft_vocab]``, sorted)."""
        ids = draft_to_target.to(torch.long)
        if ids.shape != (self.cfg.draft_vocab_size,):
            raise ValueError(f"need {self.cfg.draft_vocab_size} target ids, got {tuple(ids.shape)}")
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocabulary ids -> target vocabulary ids."""
        return draft_ids + self.d2t[draft_ids]

    def combine(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """The target's captured hidden states ``# [..., n * target_hidden]`` -> the head's
        width (``fc``)."""
        return self.fc(aux_hidden.to(self.fc.weight.dtype))

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: HeadKV | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the head over ``# [B, T]`` positions.

        Args:
            embeds: ``# [B, T, hidden]`` the target's embedding of token t + 1.
            hidden: ``# [B, T, hidden]`` :meth:`combine`'d target hidden states of token t, or
                the head's own output of the position before (later draft steps).
            positions: ``# [B, T]`` position t of each row.
            cache: the sequence's head K/V (B = 1), or None for one causal pass (training).
        Returns:
            ``(logits # [B, T, draft_vocab] fp32, the state the next draft step is fed #
            [B, T, hidden])``: the layer's output before the final norm (after it with
            ``norm_output``).
        """
        cos, sin = self.rotary(positions, hidden.dtype)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        out = self.layers[0](embeds, hidden, cos, sin, positions, cache)
        normed = self.norm(out)
        return self.lm_head(normed).float(), normed if self.cfg.norm_output else out

    def new_cache(self, base: int, capacity: int = 256) -> HeadKV:
        """An empty K/V store for one sequence whose first head position is ``base``."""
        cfg, w = self.cfg, self.fc.weight
        shape = (capacity, cfg.num_kv_heads, cfg.head_dim)
        return HeadKV(w.new_empty(shape), w.new_empty(shape), base=base)
