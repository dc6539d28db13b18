"""Check that a model's weights fit in memory *before* loading them."""

from __future__ import annotations

import os

import torch

from specserve.loading.errors import InsufficientMemoryError

# Room kept free for activations, the KV cache and the rest of the process.
HEADROOM_BYTES = 512 << 20


def available_bytes(device: torch.device) -> int:
    """Free memory on ``device``: MemAvailable for the CPU, free GPU memory for CUDA."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        raise ValueError(f"unsupported device {device}")
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_fits(
    num_params: int,
    dtype: torch.dtype,
    device: torch.device,
    name: str,
    available: int | None = None,
) -> int:
    """Raise InsufficientMemoryError when ``num_params`` weights of ``dtype`` would not fit.

    Returns the weight bytes needed.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    need = num_params * elem
    free = available_bytes(device) if available is None else available
    if need + HEADROOM_BYTES > free:
        raise InsufficientMemoryError(
            f"{name} needs {need / 2**30:.2f} GiB for {num_params / 1e9:.2f}B parameters in "
            f"{dtype} (+{HEADROOM_BYTES >> 20} MiB headroom) but only {free / 2**30:.2f} GiB is "
            f"available on {device}; use a smaller model or dtype (e.g. bfloat16)"
        )
    return need
