"""Decode and verify steps with one native call per decoder layer (bf16 models on CPU).

Why: a decode step is bound by reading the weights, but the eager module also dispatches ~1,900
small ATen ops per step around those matmuls (norms, RoPE, cache writes, attention, residuals),
10-15 ms more at the 1.5B's size. A native op (``csrc/decoder_layer.cpp``) runs a whole layer
in one call on reused buffers, in one of two forms:

- ``int4_decoder_layer`` for quantised models whose projections all run on the native int4
  kernel (models/native/int4_native.py) or the native int8-group kernel
  (models/native/int8_native.py), in any mix (``Int4Linear`` / ``Int8GroupLinear``);
- ``bf16_decoder_layer`` for unquantised bf16 models, on the model's own weights through the
  native bf16 kernel (models/native/bf16_native.py). Such a model also gets the native LM
  head (``DecoderLM.logits_runner``).

When: :func:`enable` is called on every model that the loader builds and on every quantised
one (models/quant/quantize.py). It turns the path on only where every layer can take it: bf16
activations on CPU, every projection on one of the native kernels, head_dim and hidden sizes
multiples of 16. Every forward takes it: decode steps and ``k + 1``-token verifies in one call
per layer, prompts in chunks of ``DecoderLM.prompt_chunk_rows`` tokens (:data:`BF16_PROMPT_ROWS`
for bf16 weights, else 16), each attending to what the earlier ones cached.
``SPECSERVE_FUSED_LAYER=0`` (checked at set-up) turns it off, e.g. to compare both paths.

Numbers: the residual stream between layers stays in fp32, bf16 being only what enters a
projection, the KV cache and the attention output, and the final norm's output
(``norm_rope.final_norm``): closer to fp32 activations than the eager bf16 module
(docs/benchmarks.md). ``SPECSERVE_FP32_RESIDUAL=0`` (read at set-up) keeps it in bf16,
rounding wherever the eager path does. Either way the op accumulates in fp32 and agrees with
the eager path to bf16 rounding, not bit for bit. Each query row's result is independent of
the batch, of the chunk it is in and of the context length the batch is padded to, so
speculative greedy output equals plain greedy output on this path, also with several
sequences batched. Prompts take the same path, so a prompt's cached keys and values and its
first token are, bit for bit, what decoding it one token at a time gives (prefill speed:
``benchmarks/bf16_kernel.py --part prefill``, docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from types import ModuleType
from typing import cast

import torch

from specserve.models.cache_tensors import KVCacheTensors
from specserve.models.decoder import SHORT_FORWARD_ROWS, AttentionMetadata, DecoderLayer, DecoderLM
from specserve.models.native import bf16_native, int4_native, int8_native
from specserve.models.native.env_switch import switched_off
from specserve.models.native.tile_stream import (
    QUANTISED_X,
    TILES_MASK,
    TILES_PERMITTED,
    TILES_SWITCHED,
    exact_x_bit,
)
from specserve.models.quant.int8_group import Int8GroupLinear
from specserve.models.quant.layers import Int4Linear

logger = logging.getLogger(__name__)

_MLP = ("gate", "up", "down")
MAX_ROWS = SHORT_FORWARD_ROWS  # new tokens per sequence up to which the fused path runs
BF16_PROMPT_ROWS = 128  # bf16 prompt chunk: on the tiles, weights read once a call (benchmarks.md)
# Input rows from which a draft model's quantised matmuls take the AMX tiles (wherever the CPU
# has them): on the gguf 0.5B a forward of 3 rows ran at 1.02x of vdpbf16ps on them, of 4 at
# 1.09x, of a 16-row prompt chunk at 1.77x (docs/benchmarks.md, benchmarks/int8_group_kernel.py
# --part step --switch amx --model qwen2.5-coder-0.5b-instruct --max-new 16).
DRAFT_TILE_ROWS = 4
_ENV_SWITCH = "SPECSERVE_FUSED_LAYER"
_FP32_RESIDUAL_SWITCH = "SPECSERVE_FP32_RESIDUAL"


@dataclass(frozen=True)
class LayerWeights:
    """The op (``int4_decoder_layer`` or ``bf16_decoder_layer``) for one layer and the
    tensors and sizes it takes after the activations and cache, in its order."""

    layer_idx: int
    op: str
    args: tuple[object, ...]
    # int4_decoder_layer: forwards of fewer rows pass short_mode last (no tiles; x bits kept)
    tiles_from_rows: int = 1
    short_mode: int = 0
    # The stream's dtype between layers: fp32 unless SPECSERVE_FP32_RESIDUAL=0 (eager's bf16)
    residual: torch.dtype = torch.float32


def _layers(model: DecoderLM) -> list[DecoderLayer]:
    return [cast("DecoderLayer", layer) for layer in model.model.layers]


_QUANT_LINEARS = (Int4Linear, Int8GroupLinear)
_Kernel = ModuleType  # int4_native, int8_native, bf16_native: available(), unavailable_reason()


def _native_args(linear: object, what: str) -> tuple[object, ...]:
    """``(qweight, scales, row_scale, group_size)`` of a projection on a native kernel (the
    op tells the int4 and int8-group layouts apart by the qweight's dtype, and byte from
    six-bit int8 codes by its dimensions; superblock constants: the superblock)."""
    if not isinstance(linear, _QUANT_LINEARS) or linear.native is None:
        raise _NotFusable(f"{what} is not on the native int4 or int8-group kernel")
    p = linear.native
    return (p.qweight, p.scales, p.row_scale, p.group_size)


class _NotFusable(Exception):
    """A layer the fused ops cannot take (the message says why)."""


def _norms(layer: DecoderLayer) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """(input norm, post-attention norm, (q_norm, k_norm) or two empty tensors), checked."""
    attn = layer.self_attn
    none = torch.empty(0, dtype=torch.bfloat16)
    norms = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    qk_norms: tuple[torch.Tensor, ...] = (none, none)
    if attn.q_norm is not None and attn.k_norm is not None:  # Qwen3: per-head RMSNorm
        if attn.q_norm.eps != layer.input_layernorm.eps:
            raise _NotFusable("q/k norms with their own eps")
        qk_norms = (attn.q_norm.weight, attn.k_norm.weight)
        norms += qk_norms
    if any(n.dtype != torch.bfloat16 or not n.is_contiguous() for n in norms):
        raise _NotFusable("norm weights are not contiguous bf16")
    return norms[0], norms[1], qk_norms


def _int4_layer(layer: DecoderLayer) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = attn.qkv_proj, mlp.gate_up_proj
    *qkv_args, qkv_group = _native_args(qkv, "qkv_proj")
    o_args = _native_args(attn.o_proj, "o_proj")
    gu_args = _native_args(gate_up, "gate_up_proj")
    down_args = _native_args(mlp.down_proj, "down_proj")
    assert isinstance(qkv, _QUANT_LINEARS) and qkv.native is not None
    bias = qkv.bias if qkv.bias is not None else torch.empty(0, dtype=torch.bfloat16)
    input_norm, post_norm, qk_norms = _norms(layer)
    exact = exact_x_bit((qkv, attn.o_proj, gate_up, mlp.down_proj))
    args = (
        input_norm,
        *qkv_args,
        bias.contiguous(),
        *qk_norms,
        qkv_group,
        *o_args,
        post_norm,
        *gu_args,
        *down_args,
        attn.num_heads,
        attn.num_kv_heads,
        float(layer.input_layernorm.eps),
        # as allow_tiles / set_draft set all four (short_mode: forwards below tiles_from_rows)
        qkv.native.tile_mode(qkv.native.tiles_from_rows) | exact,
    )
    n = qkv.native
    return LayerWeights(
        attn.layer_idx, "int4_decoder_layer", args, n.tiles_from_rows, n.tile_mode(1) | exact
    )


def _dense(linear: object, what: str) -> torch.nn.Linear:
    if type(linear) is not torch.nn.Linear:
        raise _NotFusable(f"{what} is {type(linear).__name__}, not a bf16 linear")
    w = linear.weight
    if w.dtype != torch.bfloat16 or not w.is_contiguous() or w.shape[1] % bf16_native.K_MULTIPLE:
        raise _NotFusable(f"{what} weight is not contiguous bf16 with a multiple of 16 inputs")
    return linear


def _bf16_layer(layer: DecoderLayer) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    q, k, v = (_dense(getattr(attn, f"{p}_proj"), f"{p}_proj") for p in "qkv")
    o = _dense(attn.o_proj, "o_proj")
    gate, up, down = (_dense(getattr(mlp, f"{p}_proj"), f"{p}_proj") for p in _MLP)
    if o.bias is not None or any(m.bias is not None for m in (gate, up, down)):
        raise _NotFusable("biases outside q/k/v")
    biases = [m.bias for m in (q, k, v)]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise _NotFusable("bias on only some of q/k/v")
    none = torch.empty(0, dtype=torch.bfloat16)
    bias = torch.cat([b for b in biases if b is not None]) if biases[0] is not None else none
    input_norm, post_norm, qk_norms = _norms(layer)
    args = (
        input_norm,
        q.weight,
        k.weight,
        v.weight,
        bias.to(torch.bfloat16).contiguous(),
        *qk_norms,
        o.weight,
        post_norm,
        gate.weight,
        up.weight,
        down.weight,
        attn.num_heads,
        attn.num_kv_heads,
        float(layer.input_layernorm.eps),
    )
    return LayerWeights(attn.layer_idx, "bf16_decoder_layer", args)


def _plan(model: DecoderLM) -> list[LayerWeights] | str:
    """Every layer's fused-call arguments, or why ``model`` cannot take the fused path."""
    if switched_off(_ENV_SWITCH):
        return f"disabled by {_ENV_SWITCH}={os.environ.get(_ENV_SWITCH)}"
    if model.dtype != torch.bfloat16 or model.device.type != "cpu":
        return f"needs bf16 on CPU, the model is {model.dtype} on {model.device}"
    cfg = model.cfg
    if cfg.head_dim % 16 or cfg.hidden_size % 16:
        return f"head_dim {cfg.head_dim} / hidden {cfg.hidden_size} not multiples of 16"
    layers = _layers(model)
    quantised = layers[0].self_attn.qkv_proj is not None
    kernels = _quant_kernels(layers) if quantised else {"bf16": bf16_native}
    for name, kernel in kernels.items():
        if not kernel.available():
            return f"native {name} kernel unavailable: {kernel.unavailable_reason()}"
    try:
        plan = [(_int4_layer if quantised else _bf16_layer)(layer) for layer in layers]
    except _NotFusable as exc:
        return str(exc)
    if switched_off(_FP32_RESIDUAL_SWITCH):
        plan = [replace(w, residual=torch.bfloat16) for w in plan]
    return plan


def _quant_kernels(layers: list[DecoderLayer]) -> dict[str, _Kernel]:
    """The native kernels the projections of a quantised model's layers would run on: the
    int8-group one for each ``Int8GroupLinear``, the int4 one for anything else (which
    ``_native_args`` then rejects unless it is an ``Int4Linear`` on that kernel)."""
    kernels: dict[str, _Kernel] = {}
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            if isinstance(linear, Int8GroupLinear):
                kernels["int8-group"] = int8_native
            else:
                kernels["int4"] = int4_native
    return kernels


def why_not(model: DecoderLM) -> str | None:
    """Why ``model`` cannot take the fused path (None: it can)."""
    plan = _plan(model)
    return plan if isinstance(plan, str) else None


def describe(model: DecoderLM) -> str:
    """How ``model``'s decode and verify steps run, in words for logs and metrics:
    ``native int4_decoder_layer``, ``native bf16_decoder_layer on AMX tiles`` (the bf16 op
    names its kernel, :func:`bf16_native.describe_kernel`; the quantised op says ``on AMX
    tiles`` where :func:`int4_native.amx_tiles` is on and the model's weights may take them,
    :func:`allow_tiles`) or ``eager (<why not>)``; ``, <kind> on int8 x`` (``int4_native.
    int8_activation_kind``) and ``, bf16 residual stream`` where they apply."""
    layers = _layers(model)
    fused = layers[0].fused if layers else None
    if model.layer_runner is run_layers and isinstance(fused, LayerWeights):
        bf16_stream = ", bf16 residual stream" if fused.residual == torch.bfloat16 else ""
        if fused.op == "bf16_decoder_layer":
            return f"native {fused.op} on {bf16_native.describe_kernel()}{bf16_stream}"
        mode = cast("int", fused.args[-1])
        one_row_x8 = fused.short_mode & QUANTISED_X and int4_native.quantised_x()
        x8 = f", {k} on int8 x" if (k := int4_native.int8_activation_kind(model)) else ""
        x8 += (", x in int8 for one-row int4 matmuls" if one_row_x8 else "") + bf16_stream
        if mode & TILES_MASK == TILES_SWITCHED and int4_native.amx_tiles():
            return f"native {fused.op} on AMX tiles{x8}"
        if mode & TILES_MASK == TILES_PERMITTED and int4_native.amx_tiles(switched=False):
            return f"native {fused.op} on AMX tiles from {fused.tiles_from_rows} rows{x8}"
        return f"native {fused.op}{x8}"
    return f"eager ({why_not(model) or 'not enabled'})"


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
    bf16_op = plan[0].op == "bf16_decoder_layer"
    model.prompt_chunk_rows = BF16_PROMPT_ROWS if bf16_op else SHORT_FORWARD_ROWS
    head = model.lm_head
    bf16_head = bf16_op and type(head) is torch.nn.Linear and head.bias is None
    model.logits_runner = native_logits if bf16_head else None
    return True


def allow_tiles(model: torch.nn.Module, allowed: bool, from_rows: int = 1) -> None:
    """Whether the int4 and six-bit matmuls of ``model`` may run on the AMX tiles, and in
    calls of how many input rows on: every packed weight's ``tiles`` and ``tiles_from_rows``,
    and the fused layers' arguments again where they are on.

    A target's weights take them from one row (the default), in every call, where they are
    switched on (``SPECSERVE_QUANT_AMX=1``, ``int4_native.amx_tiles``): a row's result must
    not depend on how many rows share the call. A draft model's take them from
    :data:`DRAFT_TILE_ROWS` (the engine builder, ``perf``) wherever the CPU has them, switch
    or not: its proposals need no batch invariance, its one-token steps are faster on the
    ``vdpbf16ps`` kernels, and its prompt chunks and catch-ups faster on the tiles
    (``PackedTiles.tile_mode``)."""
    if from_rows < 1:
        raise ValueError(f"from_rows must be >= 1, got {from_rows}")
    for module in model.modules():
        packed = getattr(module, "native", None)
        if isinstance(module, _QUANT_LINEARS) and packed is not None:
            packed.tiles = allowed
            packed.tiles_from_rows = from_rows
    if isinstance(model, DecoderLM) and model.layer_runner is run_layers:
        enable(model)


def set_draft(model: torch.nn.Module) -> None:
    """Mark ``model``'s quantised weights as a draft model's, whose proposals the target
    checks: its matmuls take the AMX tiles in calls of :data:`DRAFT_TILE_ROWS` rows or more
    wherever the CPU has them (:func:`allow_tiles`), and its one-row int4 calls round x to int8
    where the kernel has that cheaper path (``int4_native.quantised_x``; on AVX2 one row of
    the 0.5B's projections and LM head costs 1.1-1.8x less, docs/benchmarks.md). Neither
    changes what the target commits, only which tokens are proposed. ``SPECSERVE_DRAFT_INT8_X=0``
    (read here) keeps x exact."""
    allow_tiles(model, True, from_rows=DRAFT_TILE_ROWS)
    quantised = not switched_off("SPECSERVE_DRAFT_INT8_X")
    for module in model.modules():
        packed = getattr(module, "native", None)
        if isinstance(module, _QUANT_LINEARS) and packed is not None:
            packed.quantised_x = quantised
    if isinstance(model, DecoderLM) and model.layer_runner is run_layers:
        enable(model)


def disable(model: DecoderLM) -> None:
    """Back to the eager path for every forward of ``model``."""
    model.layer_runner = None
    model.logits_runner = None
    model.prompt_chunk_rows = SHORT_FORWARD_ROWS
    for layer in _layers(model):
        layer.fused = None


def run_layers(
    model: DecoderLM,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    meta: AttentionMetadata,
    kv: KVCacheTensors,
    captured: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """All decoder layers over ``x # [B, T, hidden]`` (bf16), one op call each; returns the
    residual stream after the last layer in fp32 (bf16 with ``SPECSERVE_FP32_RESIDUAL=0``),
    to which the caller applies the final norm (``DecoderLM``: rounded to bf16 after it).
    ``cos``/``sin``: ``# [B, T, head_dim]``. With ``captured`` a list, the residual stream
    entering each layer in ``model.capture_layers`` is appended to it (``# [B, T, hidden]``
    each in the model's dtype, once per layer, in layer order)."""
    b, t, h = x.shape
    layers = _layers(model)
    first = layers[0].fused
    assert isinstance(first, LayerWeights), "run_layers on a model without fused layers (enable)"
    rows = _as_residual(x.reshape(b * t, h), first.residual)
    positions = meta.positions.reshape(-1).contiguous()
    slots = meta.slot_mapping.reshape(-1).contiguous()
    context = meta.context_slots.contiguous()
    cos2 = cos.reshape(b * t, -1).contiguous()
    sin2 = sin.reshape(b * t, -1).contiguous()
    capture = set(model.capture_layers) if captured is not None else set()
    for i, layer in enumerate(layers):
        if i in capture:  # in the model's dtype, whatever the residual stream's
            assert captured is not None
            captured.append(rows.view(b, t, h).to(x.dtype))
        w = layer.fused
        assert isinstance(w, LayerWeights), "run_layers on a model without fused layers (enable)"
        args = w.args if b * t >= w.tiles_from_rows else (*w.args[:-1], w.short_mode)
        rows = getattr(torch.ops.specserve, w.op)(
            rows,
            positions,
            slots,
            context,
            cos2,
            sin2,
            kv._k_layers[w.layer_idx],
            kv._v_layers[w.layer_idx],
            *args,
        )
    return rows.view(b, t, h)


# Eager even inside ``torch.compile``: fused with what computed x (an embedding's dequantising),
# inductor would skip x's bf16 rounding on the way to fp32 and change every later bit.
@torch.compiler.disable
def _as_residual(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).contiguous()


def native_logits(model: DecoderLM, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head of a bf16 model through the native bf16 kernel (rows batch invariant, like
    the layers'); fp32 logits of the bf16 products, as the eager ``lm_head(hidden).float()``."""
    if hidden.dtype != torch.bfloat16 or not hidden.is_cpu:
        return model.lm_head(hidden).float()
    return bf16_native.matmul(hidden, model.lm_head.weight).float()
