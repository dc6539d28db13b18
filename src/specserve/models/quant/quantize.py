"""Turn a loaded :class:`DecoderLM` into a weight-only int8 / int4 model, in place.

``quantize_weights`` computes the portable quantised tensors (what the disk cache stores);
``apply_quantized`` swaps the modules; ``quantize_model`` does both. What is quantised:
every projection of every decoder layer, the LM head, and the token embedding (int8 rows,
for both formats: a lookup reads one row, so its size matters for memory, not speed). Norm
weights and biases stay in the compute dtype.

Fused projections: the quantised model computes q, k and v with one module
(``self_attn.qkv_proj``) and gate and up with another (``mlp.gate_up_proj``), their rows
concatenated; the separate modules become None. Both formats quantise each output row on
its own, so a fused module's rows are exactly the separate modules' rows: fewer, larger
matmuls per layer (fewer dispatches, better split across threads), the same numbers.

Portable state names, always per original module (the cache does not depend on fusion):
``<linear>.qweight``/``<linear>.scale`` (int8),
``<linear>.nibbles``/``<linear>.scale``/``<linear>.minimum`` (int4),
``model.embed_tokens.qweight``/``model.embed_tokens.scale`` (int8 embedding).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import torch
from torch import nn

from specserve.models.decoder import DecoderLM
from specserve.models.native import fused_layer
from specserve.models.quant.int4_weight import DEFAULT_GROUP_SIZE, Int4Weight, quantize_int4
from specserve.models.quant.layers import (
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    QuantFormat,
    quantize_int8,
)

logger = logging.getLogger(__name__)

QUANT_FORMATS: tuple[QuantFormat, ...] = ("int8", "int4")
EMBED = "model.embed_tokens"


def _linear_names(model: DecoderLM) -> list[str]:
    names = [n for n, m in model.model.layers.named_modules() if isinstance(m, nn.Linear)]
    return [f"model.layers.{n}" for n in names] + ["lm_head"]


def _layer_names(model: DecoderLM) -> list[str]:
    return [f"model.layers.{i}" for i in range(len(model.model.layers))]


def _check_format(fmt: str) -> None:
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantised weight format {fmt!r}; choose from {QUANT_FORMATS}")


@torch.no_grad()
def quantize_weights(
    model: DecoderLM, fmt: QuantFormat, group_size: int = DEFAULT_GROUP_SIZE
) -> dict[str, torch.Tensor]:
    """Portable quantised tensors of ``model``'s float weights (the model is not changed)."""
    _check_format(fmt)
    t0 = time.perf_counter()
    state: dict[str, torch.Tensor] = {}
    embed = model.model.embed_tokens
    if not isinstance(embed, nn.Embedding):
        raise ValueError("model is already quantised")
    q, s = quantize_int8(embed.weight)
    state[f"{EMBED}.qweight"], state[f"{EMBED}.scale"] = q, s
    for name in _linear_names(model):
        if name == "lm_head" and model.cfg.tie_word_embeddings and fmt == "int8":
            continue  # shares the embedding's int8 rows
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear), name
        if fmt == "int8":
            q, s = quantize_int8(linear.weight)
            state[f"{name}.qweight"], state[f"{name}.scale"] = q, s
        else:
            w4 = quantize_int4(linear.weight, group_size)
            state[f"{name}.nibbles"] = w4.nibbles
            state[f"{name}.scale"] = w4.scale
            state[f"{name}.minimum"] = w4.minimum
    logger.info(
        "quantised %d linears to %s in %.1f s",
        len(_linear_names(model)),
        fmt,
        time.perf_counter() - t0,
    )
    return state


def fused_bias(linears: list[nn.Linear], dtype: torch.dtype) -> torch.Tensor | None:
    """The bias of one module computing the rows of ``linears`` in order (zeros where a part
    has none; None when none has one)."""
    if all(lin.bias is None for lin in linears):
        return None
    parts = [
        lin.bias.detach() if lin.bias is not None else torch.zeros(lin.out_features, dtype=dtype)
        for lin in linears
    ]
    return torch.cat(parts).clone()


# (fused module, its parts): rows of the parts in this order.
FUSED = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
)


def _quantized_linear(
    model: DecoderLM,
    names: tuple[str, ...],
    fmt: QuantFormat,
    state: Mapping[str, torch.Tensor],
    embed: Int8Embedding,
    group_size: int,
) -> nn.Module:
    """One quantised linear computing the rows of the float linears ``names``, in order."""
    dtype, device = model.dtype, model.device
    linears: list[nn.Linear] = []
    for n in names:
        lin = model.get_submodule(n)
        assert isinstance(lin, nn.Linear), n
        linears.append(lin)
    bias = fused_bias(linears, dtype)
    if names == ("lm_head",) and model.cfg.tie_word_embeddings and fmt == "int8":
        return Int8Linear(embed.qweight, state[f"{EMBED}.scale"].to(device), bias, dtype)
    if fmt == "int8":
        qweight = torch.cat([state[f"{n}.qweight"] for n in names])
        scale = torch.cat([state[f"{n}.scale"] for n in names])
        return Int8Linear(qweight.to(device), scale.to(device), bias, dtype)
    w4 = Int4Weight(
        torch.cat([state[f"{n}.nibbles"] for n in names]),
        torch.cat([state[f"{n}.scale"].float() for n in names]),
        torch.cat([state[f"{n}.minimum"].float() for n in names]),
        group_size,
    )
    return Int4Linear(w4, bias, dtype, device)


@torch.no_grad()
def apply_quantized(
    model: DecoderLM,
    fmt: QuantFormat,
    state: Mapping[str, torch.Tensor],
    group_size: int = DEFAULT_GROUP_SIZE,
) -> DecoderLM:
    """Replace ``model``'s linears and embedding by quantised modules built from ``state``.

    The compute dtype and device stay the model's. Remaining float tensors (norms, biases)
    are copied, so nothing keeps a memory-mapped float checkpoint alive afterwards.
    """
    _check_format(fmt)
    dtype, device = model.dtype, model.device
    embed = Int8Embedding(
        state[f"{EMBED}.qweight"].to(device), state[f"{EMBED}.scale"].to(device), dtype
    )
    in_fusion = {f"{layer}.{p}" for layer in _layer_names(model) for _, ps in FUSED for p in ps}
    for name in _linear_names(model):
        if name in in_fusion:
            continue
        new = _quantized_linear(model, (name,), fmt, state, embed, group_size)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
    for layer in _layer_names(model):
        for fused, parts in FUSED:
            names = tuple(f"{layer}.{p}" for p in parts)
            new = _quantized_linear(model, names, fmt, state, embed, group_size)
            parent = model.get_submodule(f"{layer}.{fused.rpartition('.')[0]}")
            setattr(parent, fused.rpartition(".")[2], new)
            for p in parts:
                setattr(parent, p.rpartition(".")[2], None)
    model.model.embed_tokens = embed  # type: ignore[assignment]  # same call contract
    for module in model.modules():
        for pname, param in list(module.named_parameters(recurse=False)):
            setattr(module, pname, nn.Parameter(param.detach().clone(), requires_grad=False))
    fused_layer.enable(model)  # int4: one native op per layer where the model qualifies
    return model


def quantize_model(
    model: DecoderLM, fmt: QuantFormat, group_size: int = DEFAULT_GROUP_SIZE
) -> DecoderLM:
    """Quantise ``model`` in place (see the module docstring) and return it."""
    return apply_quantized(model, fmt, quantize_weights(model, fmt, group_size), group_size)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
