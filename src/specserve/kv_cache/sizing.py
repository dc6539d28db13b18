"""How many KV blocks fit a memory budget, and budgets taken from free host or GPU memory."""

from __future__ import annotations

import logging
import os

import torch

from specserve.config import CacheConfig
from specserve.models.arch import ArchConfig
from specserve.models.cache_tensors import KVCacheTensors

logger = logging.getLogger(__name__)


def bytes_per_block(arch: ArchConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of K and V for one block across every layer of ``arch``."""
    return KVCacheTensors.bytes_per_block(
        arch.num_layers, block_size, arch.num_kv_heads, arch.head_dim, dtype
    )


def num_blocks_for(cache: CacheConfig, arch: ArchConfig, dtype: torch.dtype) -> int:
    """Blocks of the cache (scratch block included): ``cache.num_blocks`` when set, else as
    many as ``cache.memory_bytes`` holds.

    Raises:
        ValueError: the budget holds fewer than two blocks.
    """
    if cache.num_blocks is not None:
        return cache.num_blocks
    per_block = bytes_per_block(arch, cache.block_size, dtype)
    num = cache.memory_bytes // per_block
    if num < 2:
        raise ValueError(
            f"KV cache budget of {cache.memory_bytes} bytes holds {num} blocks of "
            f"{per_block} bytes; need at least 2"
        )
    return int(num)


def free_memory_bytes(device: torch.device | str) -> int:
    """Memory currently available on ``device``: free GPU memory for CUDA, else the host's
    ``MemAvailable`` (Linux) or, failing that, total physical memory / 2."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        logger.warning("cannot read /proc/meminfo; guessing free memory")
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)


def memory_budget_from_free(fraction: float, device: torch.device | str) -> int:
    """``fraction`` (0 < fraction <= 1) of the memory now free on ``device``, in bytes."""
    if not (0.0 < fraction <= 1.0):
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return int(free_memory_bytes(device) * fraction)
