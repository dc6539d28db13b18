"""Medusa heads: K small heads that each guess one token further ahead from one hidden state.

Medusa (Cai et al., 2024) puts K heads on the target's last hidden state of token t (the
final normed output, whose LM-head row scores token t + 1). Head i (1-based) is a stack of
residual blocks ``x + SiLU(W x + b)`` followed by an LM head, and scores token t + 1 + i. All
K guesses come from one hidden state, so drafting costs K small matmuls and one LM-head call
for all heads together, with no sequential draft steps and no draft KV cache.

The heads here share the target's LM head (``original_lm_head`` in vLLM's Medusa config):
nothing vocabulary-sized is trained or stored. Parameter names follow vLLM's Medusa layout
(``blocks.{i}.layers.{j}.weight`` / ``.bias``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MedusaConfig:
    """Shapes of a set of Medusa heads.

    Attributes:
        hidden_size: the target's width (heads read its final hidden state).
        vocab_size: the target's vocabulary (its LM head scores every head's output).
        num_heads: K, the heads; head i guesses the token i + 1 past the target's own.
        num_layers: residual blocks per head.
    """

    hidden_size: int
    vocab_size: int
    num_heads: int
    num_layers: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.num_heads <= 32:
            raise ValueError(f"num_heads must be in [1, 32], got {self.num_heads}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")


class ResidualBlock(nn.Module):
    def __init__(self, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + F.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    """K Medusa heads without their LM head (see the module docstring)."""

    def __init__(self, cfg: MedusaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(
            ResidualBlock(cfg.hidden_size, cfg.num_layers) for _ in range(cfg.num_heads)
        )

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """``hidden # [..., hidden]`` -> each of the first ``num_heads`` heads' hidden state
        before the LM head, ``# [..., num_heads, hidden]``."""
        blocks = list(self.blocks)[: num_heads or self.cfg.num_heads]
        x = hidden.to(self.dtype)
        return torch.stack([block(x) for block in blocks], dim=-2)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype
