"""Decode and verify steps with one native call per decoder layer (int4 weights, bf16, CPU).

Why: at batch 1 a step of the 1.5B target reads ~0.9 GB of int4 weights (~30 ms here), but
the eager module dispatches ~1,900 small ATen ops per step around those matmuls (norms, RoPE,
cache writes, attention, residuals), which cost another 10-15 ms. ``specserve::
int4_decoder_layer`` (``csrc/decoder_layer.cpp``) runs a whole layer in one call on reused
buffers.

When: :func:`enable` is called on every model quantised to int4 (models/quant/quantize.py). It turns
the path on only where every layer can take it: bf16 activations on CPU, every projection on
the native int4 kernel (models/native/int4_native.py), head_dim a multiple of 32.
Chunks of at most ``MAX_ROWS`` new tokens per sequence (decode steps, ``k + 1``-token
verifies) take it; longer chunks (prefill) keep the eager path. ``SPECSERVE_FUSED_LAYER=0``
turns it off (checked when a model is set up), e.g. to compare both paths.

Numbers: the op rounds to bf16 wherever the eager bf16 path does, and accumulates in fp32, so
the two agree to bf16 rounding but not bit for bit. Like the eager row-by-row attention, each
query row's result is independent of the batch and of the chunk it is in: speculative greedy
output equals plain greedy output on this path too.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import cast

import torch

from specserve.models.cache_tensors import KVCacheTensors
from specserve.models.decoder import SHORT_FORWARD_ROWS, AttentionMetadata, DecoderLayer, DecoderLM
from specserve.models.native import int4_native
from specserve.models.native.env_switch import switched_off
from specserve.models.quant.layers import Int4Linear

logger = logging.getLogger(__name__)

MAX_ROWS = SHORT_FORWARD_ROWS  # new tokens per sequence up to which the fused path runs
_ENV_SWITCH = "SPECSERVE_FUSED_LAYER"


@dataclass(frozen=True)
class LayerWeights:
    """The tensors and sizes ``int4_decoder_layer`` takes for one layer, in its order."""

    layer_idx: int
    args: tuple[object, ...]


def _layers(model: DecoderLM) -> list[DecoderLayer]:
    return [cast("DecoderLayer", layer) for layer in model.model.layers]


def _native_args(linear: object, what: str) -> tuple[object, ...]:
    if not isinstance(linear, Int4Linear) or linear.native is None:
        raise _NotFusable(f"{what} is not on the native int4 kernel")
    p = linear.native
    return (p.qweight, p.scales, p.row_scale)


class _NotFusable(Exception):
    pass


def _layer_weights(layer: DecoderLayer) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = attn.qkv_proj, mlp.gate_up_proj
    qkv_args = _native_args(qkv, "qkv_proj")
    o_args = _native_args(attn.o_proj, "o_proj")
    gu_args = _native_args(gate_up, "gate_up_proj")
    down_args = _native_args(mlp.down_proj, "down_proj")
    assert isinstance(qkv, Int4Linear) and isinstance(gate_up, Int4Linear)
    none = torch.empty(0, dtype=torch.bfloat16)
    bias = qkv.bias if qkv.bias is not None else none
    norms = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    qk_norms = (none, none)
    if attn.q_norm is not None and attn.k_norm is not None:  # Qwen3: per-head RMSNorm
        if attn.q_norm.eps != layer.input_layernorm.eps:
            raise _NotFusable("q/k norms with their own eps")
        qk_norms = (attn.q_norm.weight, attn.k_norm.weight)
        norms += qk_norms
    if any(n.dtype != torch.bfloat16 or not n.is_contiguous() for n in norms):
        raise _NotFusable("norm weights are not contiguous bf16")
    args = (
        norms[0],
        *qkv_args,
        bias.contiguous(),
        *qk_norms,
        qkv.group_size,
        *o_args,
        attn.o_proj.group_size,  # type: ignore[union-attr]
        norms[1],
        *gu_args,
        gate_up.group_size,
        *down_args,
        mlp.down_proj.group_size,  # type: ignore[union-attr]
        attn.num_heads,
        attn.num_kv_heads,
        float(layer.input_layernorm.eps),
    )
    return LayerWeights(attn.layer_idx, args)


def _plan(model: DecoderLM) -> list[LayerWeights] | str:
    """Every layer's fused-call arguments, or why ``model`` cannot take the fused path."""
    if switched_off(_ENV_SWITCH):
        return f"disabled by {_ENV_SWITCH}={os.environ.get(_ENV_SWITCH)}"
    if model.dtype != torch.bfloat16 or model.device.type != "cpu":
        return f"needs bf16 on CPU, the model is {model.dtype} on {model.device}"
    cfg = model.cfg
    if cfg.head_dim % 32 or cfg.hidden_size % 16:
        return f"head_dim {cfg.head_dim} / hidden {cfg.hidden_size} not multiples of 32 / 16"
    if not int4_native.available():
        return f"native int4 kernel unavailable: {int4_native.unavailable_reason()}"
    try:
        return [_layer_weights(layer) for layer in _layers(model)]
    except _NotFusable as exc:
        return str(exc)


def why_not(model: DecoderLM) -> str | None:
    """Why ``model`` cannot take the fused path (None: it can)."""
    plan = _plan(model)
    return plan if isinstance(plan, str) else None


def enable(model: DecoderLM) -> bool:
    """Give every layer of ``model`` its fused-call arguments and switch the model's short
    forwards to :func:`run_layers` if the whole model qualifies (see the module docstring);
    returns whether it did. Idempotent."""
    plan = _plan(model)
    if isinstance(plan, str):
        logger.debug("fused decoder layers off: %s", plan)
        disable(model)
        return False
    for layer, weights in zip(_layers(model), plan, strict=True):
        layer.fused = weights
    model.layer_runner = run_layers
    return True


def disable(model: DecoderLM) -> None:
    """Back to the eager path for every forward of ``model``."""
    model.layer_runner = None
    for layer in _layers(model):
        layer.fused = None


def run_layers(
    model: DecoderLM,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    meta: AttentionMetadata,
    kv: KVCacheTensors,
) -> torch.Tensor:
    """All decoder layers over ``x # [B, T, hidden]`` (bf16), one op call each; the caller
    applies the final norm. ``cos``/``sin``: ``# [B, T, head_dim]``."""
    b, t, h = x.shape
    rows = x.reshape(b * t, h).contiguous()
    positions = meta.positions.reshape(-1).contiguous()
    slots = meta.slot_mapping.reshape(-1).contiguous()
    context = meta.context_slots.contiguous()
    cos2 = cos.reshape(b * t, -1).contiguous()
    sin2 = sin.reshape(b * t, -1).contiguous()
    op = torch.ops.specserve.int4_decoder_layer
    for layer in _layers(model):
        w = layer.fused
        assert isinstance(w, LayerWeights), "run_layers on a model without fused layers (enable)"
        rows = op(
            rows,
            positions,
            slots,
            context,
            cos2,
            sin2,
            kv._k_layers[w.layer_idx],
            kv._v_layers[w.layer_idx],
            *w.args,
        )
    return rows.view(b, t, h)
