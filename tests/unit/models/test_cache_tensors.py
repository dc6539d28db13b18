"""KV cache storage (models/cache_tensors.py): zeros that take memory only where written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.models.cache_tensors import KVCacheTensors, zeros_on_demand

_STATUS = Path("/proc/self/status")


def _rss_mib() -> float:
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def test_reads_as_zeros_and_keeps_writes() -> None:
    t = zeros_on_demand((3, 5, 2), torch.bfloat16, "cpu")
    assert t.shape == (3, 5, 2) and t.dtype == torch.bfloat16
    assert torch.equal(t, torch.zeros(3, 5, 2, dtype=torch.bfloat16))
    t[1, 2] = 7.0
    assert float(t.sum()) == 14.0
    assert zeros_on_demand((0, 4), torch.float32, "cpu").shape == (0, 4)


@pytest.mark.skipif(not _STATUS.exists(), reason="reads VmRSS from /proc (Linux)")
def test_capacity_costs_no_memory_until_written() -> None:
    """A 512 MiB cache adds (almost) nothing to the resident set; writing the keys and values
    of 64 tokens adds about their pages, not the cache's size."""
    before = _rss_mib()
    kv = KVCacheTensors(
        num_layers=8, num_blocks=8192, block_size=16, num_kv_heads=2, head_dim=64,
        dtype=torch.bfloat16, device="cpu",
    )  # fmt: skip
    assert kv.k.numel() * 2 * 2 == 512 << 20  # k and v, bf16
    allocated = _rss_mib()
    assert allocated - before < 64, (before, allocated)
    slots = torch.arange(16, 80)
    for layer in range(8):
        ones = torch.ones(64, 2, 64, dtype=torch.bfloat16)
        kv.write(layer, slots, ones, ones)
    written = _rss_mib()
    assert written - before < 64, (before, written)
    k, v = kv.gather(3, slots.view(1, -1))
    assert torch.equal(k, torch.ones(1, 64, 2, 64, dtype=torch.bfloat16))
    assert torch.equal(v, k)
    k0, _ = kv.gather(3, torch.arange(100, 110).view(1, -1))
    assert not k0.any()
