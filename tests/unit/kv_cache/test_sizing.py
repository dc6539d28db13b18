"""KV cache sizing from a byte budget or from free memory."""

from __future__ import annotations

import pytest
import torch

from specserve.config import CacheConfig
from specserve.kv_cache.sizing import (
    bytes_per_block,
    memory_budget_from_free,
    num_blocks_for,
)
from tests.conftest import make_tiny_arch


def test_blocks_from_budget_and_explicit_count() -> None:
    arch = make_tiny_arch()  # 2 layers, 2 kv heads, head_dim 16
    per_block = bytes_per_block(arch, 16, torch.float32)
    assert per_block == 2 * 2 * 16 * 2 * 16 * 4
    assert num_blocks_for(CacheConfig(memory_bytes=per_block * 10 + 5), arch, torch.float32) == 10
    assert num_blocks_for(CacheConfig(memory_bytes=per_block * 10), arch, torch.bfloat16) == 20
    assert num_blocks_for(CacheConfig(num_blocks=7), arch, torch.float32) == 7
    with pytest.raises(ValueError, match="need at least 2"):
        num_blocks_for(CacheConfig(memory_bytes=per_block), arch, torch.float32)


def test_fraction_of_free_memory() -> None:
    half = memory_budget_from_free(0.5, "cpu")
    assert half > 0
    assert memory_budget_from_free(0.25, "cpu") <= half
    with pytest.raises(ValueError, match="fraction"):
        memory_budget_from_free(0.0, "cpu")
