"""Make a cheaper, weaker draft by keeping only a model's first layers.

This reproduces the reference study's draft-size question on one machine: a draft that
costs less per token but agrees with the target less often can lose the speedup. The final
norm and the LM head stay, so the truncated model still predicts tokens (badly).
"""

from __future__ import annotations

import dataclasses

from torch import nn

from specserve.models.decoder import DecoderLM


def keep_first_layers(model: DecoderLM, num_layers: int) -> DecoderLM:
    """Drop every decoder block after the first ``num_layers`` (in place; returns ``model``)."""
    total = model.cfg.num_layers
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in [1, {total}] for this model, got {num_layers}")
    model.model.layers = nn.ModuleList(list(model.model.layers)[:num_layers])
    model.cfg = dataclasses.replace(model.cfg, num_layers=num_layers)
    return model
