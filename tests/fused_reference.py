"""What a model on the fused layer ops (models/native/fused_layer.py) is checked against."""

from __future__ import annotations

import copy
import dataclasses

import torch

from specserve.models.decoder import DecoderLM
from specserve.models.native import fused_layer, int4_native


def eager_twin(model: DecoderLM) -> DecoderLM:
    """A copy of ``model`` on the eager layers."""
    twin = copy.deepcopy(model)
    fused_layer.disable(twin)
    return twin


def bf16_residual(model: DecoderLM) -> DecoderLM:
    """``model`` with its fused layers keeping the residual stream in bf16, as
    ``SPECSERVE_FP32_RESIDUAL=0`` plans them: every rounding the eager bf16 layers make."""
    for layer in model.model.layers:
        layer.fused = dataclasses.replace(layer.fused, residual=torch.bfloat16)
    return model


def reference(fused: DecoderLM, residual: str) -> tuple[DecoderLM, float]:
    """What ``fused`` is checked against, and to what relative error of the hidden states:
    with a bf16 residual stream (``residual="bf16"``, applied to ``fused`` here) the eager bf16
    layers, which it follows op by op (to bf16 rounding); with the default fp32 stream the same
    weights with fp32 activations, which it approaches more closely than bf16 layers do but not
    to one rounding (its projections take bf16 inputs; on the tiny random models of the tests
    the eager bf16 layers are 1-7 % off fp32 activations). Where some of the model's matmuls
    take int8 activations (``int4_native.int8_activation_kind``: x rounded per 32 inputs to
    1 / 127 of the group's largest, about 2.5 times bf16's relative rounding), twice that."""
    scale = 2.0 if int4_native.int8_activation_kind(fused) else 1.0
    if residual == "bf16":
        return eager_twin(bf16_residual(fused)), 2e-2 * scale
    return eager_twin(fused).float(), 6e-2 * scale
