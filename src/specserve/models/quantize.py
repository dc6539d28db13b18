"""Turn a loaded :class:`DecoderLM` into a weight-only int8 / int4 model, in place.

``quantize_weights`` computes the portable quantised tensors (what the disk cache stores);
``apply_quantized`` swaps the modules; ``quantize_model`` does both. What is quantised:
every projection of every decoder layer, the LM head, and the token embedding (int8 rows,
for both formats: a lookup reads one row, so its size matters for memory, not speed). Norm
weights and biases stay in the compute dtype.

Portable state names: ``<linear>.qweight``/``<linear>.scale`` (int8),
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
from specserve.models.quant import (
    DEFAULT_GROUP_SIZE,
    Int4Linear,
    Int4Weight,
    Int8Embedding,
    Int8Linear,
    QuantFormat,
    quantize_int4,
    quantize_int8,
)

logger = logging.getLogger(__name__)

QUANT_FORMATS: tuple[QuantFormat, ...] = ("int8", "int4")
_EMBED = "model.embed_tokens"


def _linear_names(model: DecoderLM) -> list[str]:
    names = [n for n, m in model.model.layers.named_modules() if isinstance(m, nn.Linear)]
    return [f"model.layers.{n}" for n in names] + ["lm_head"]


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
    state[f"{_EMBED}.qweight"], state[f"{_EMBED}.scale"] = q, s
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
        state[f"{_EMBED}.qweight"].to(device), state[f"{_EMBED}.scale"].to(device), dtype
    )
    for name in _linear_names(model):
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear), name
        bias = None if linear.bias is None else linear.bias.detach().clone()
        new: nn.Module
        if name == "lm_head" and model.cfg.tie_word_embeddings and fmt == "int8":
            new = Int8Linear(embed.qweight, state[f"{_EMBED}.scale"].to(device), bias, dtype)
        elif fmt == "int8":
            new = Int8Linear(
                state[f"{name}.qweight"].to(device), state[f"{name}.scale"].to(device), bias, dtype
            )
        else:
            w4 = Int4Weight(
                state[f"{name}.nibbles"],
                state[f"{name}.scale"].float(),
                state[f"{name}.minimum"].float(),
                group_size,
            )
            new = Int4Linear(w4, bias, dtype, device)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
    model.model.embed_tokens = embed  # type: ignore[assignment]  # same call contract
    for module in model.modules():
        for pname, param in list(module.named_parameters(recurse=False)):
            setattr(module, pname, nn.Parameter(param.detach().clone(), requires_grad=False))
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
