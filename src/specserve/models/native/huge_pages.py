"""CPU tensors for large read-mostly weights, backed by transparent huge pages where possible.

Why: a decode step streams the whole weight set (~0.9 GB for the 1.5B model in int4) from
memory. With 4 KiB pages that is ~220,000 pages per token, and every page's translation misses
the TLB (a nested page walk under a hypervisor). Weights in 2 MiB pages read faster: in
``benchmarks/int4_kernel.py --part thp`` a decode step of the 1.5B int4 model took 6-12 % less
time (four runs) with its packed weights in huge pages than with the same weights in 4 KiB
pages.

How: :func:`empty` hands out slices of 64 MiB slabs whose 2 MiB-aligned interior was given
``madvise(MADV_HUGEPAGE)`` before anything touched it, so the kernel backs them with huge pages
when the weights are written (the host's ``transparent_hugepage`` mode must be ``always`` or
``madvise``). A slab lives as long as any tensor cut from it. Bigger tensors get a slab of
their own. Elsewhere (not Linux, THP off, ``SPECSERVE_HUGE_PAGES=0``) it is ``torch.empty``.
Only untouched memory is advised, and only the bytes handed out are ever written, so resident
memory grows by at most one huge page per slab. :func:`adopt` moves a weight that was loaded
elsewhere (a bf16 model's projections, which the native bf16 path streams) into such memory.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import torch

from specserve.models.native.env_switch import switched_off

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
SLAB_BYTES = 64 << 20
MIN_BYTES = 1 << 20  # smaller tensors: plain torch.empty (not worth a huge page)
_ALIGN = 64
_MADV_HUGEPAGE = 14
_ENV_SWITCH = "SPECSERVE_HUGE_PAGES"
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

_lock = threading.Lock()
_state: dict[str, object] = {}  # "madvise": the libc function or None; "slab": current slab
# (address, bytes) of every slab's storage; a slab lives until its last tensor goes, which no
# Python object marks, so entries stay (a new storage of the same address and odd size:
# adopt() would skip it, costing speed only).
_slabs: set[tuple[int, int]] = set()


def _madvise() -> object | None:
    """libc's madvise where THP can be requested (decided once per process), else None."""
    if "madvise" not in _state:
        fn = None
        try:
            mode = _THP_MODE.read_text()
            if sys.platform.startswith("linux") and ("[always]" in mode or "[madvise]" in mode):
                libc = ctypes.CDLL(None, use_errno=True)
                fn = libc.madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
        except (OSError, AttributeError) as exc:
            logger.debug("transparent huge pages unavailable: %s", exc)
        _state["madvise"] = fn
    return _state["madvise"]


def available() -> bool:
    """Whether :func:`empty` can hand out huge-page-backed memory here."""
    return not switched_off(_ENV_SWITCH) and _madvise() is not None


class _Slab:
    """A fresh ``uint8`` buffer whose whole 2 MiB-aligned pages are advised; cut in order."""

    def __init__(self, nbytes: int) -> None:
        self.buffer = torch.empty(nbytes + 2 * HUGE_PAGE, dtype=torch.uint8)
        base = self.buffer.data_ptr()
        _slabs.add((base, nbytes + 2 * HUGE_PAGE))
        start = -base % HUGE_PAGE
        self.offset = start
        self.end = start + (nbytes + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
        madvise = _madvise()
        assert madvise is not None
        if madvise(base + start, self.end - start, _MADV_HUGEPAGE) != 0:  # type: ignore[operator]
            logger.debug("madvise(MADV_HUGEPAGE) failed: errno %d", ctypes.get_errno())

    def take(self, nbytes: int) -> torch.Tensor | None:
        start = -(-self.offset // _ALIGN) * _ALIGN
        if start + nbytes > self.end:
            return None
        self.offset = start + nbytes
        return self.buffer[start : start + nbytes]


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor; huge-page backed when it is large and
    :func:`available` (write it soon: pages are allocated on first touch)."""
    numel = 1
    for n in shape:
        numel *= n
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes < MIN_BYTES or not available():
        return torch.empty(shape, dtype=dtype)
    with _lock:
        if nbytes > SLAB_BYTES // 2:
            raw = _Slab(nbytes).take(nbytes)
        else:
            slab = _state.get("slab")
            raw = slab.take(nbytes) if isinstance(slab, _Slab) else None
            if raw is None:
                slab = _Slab(SLAB_BYTES)
                _state["slab"] = slab
                raw = slab.take(nbytes)
    assert raw is not None
    return raw.view(dtype).view(shape)


def adopt(param: torch.Tensor) -> bool:
    """Move ``param``'s values into memory from :func:`empty`, in place: ``param.data`` is
    swapped, so the parameter object stays and every module holding it (a tied embedding and
    LM head) reads the new memory; the values are copied exactly. Returns whether it moved:
    a tensor in a slab already (from :func:`empty`, or moved by an earlier call), a small,
    non-contiguous or non-CPU tensor, or a host without huge pages (:func:`available`) stays
    as it is."""
    data = param.data
    if (
        (data.untyped_storage().data_ptr(), data.untyped_storage().nbytes()) in _slabs
        or data.device.type != "cpu"
        or not data.is_contiguous()
        or data.numel() * data.element_size() < MIN_BYTES
        or not available()
    ):
        return False
    moved = empty(tuple(data.shape), data.dtype)
    moved.copy_(data)
    param.data = moved
    return True


def adopt_all(params: Iterable[torch.Tensor]) -> int:
    """:func:`adopt` each of ``params``; returns the bytes moved (logged at debug level)."""
    moved = sum(p.numel() * p.element_size() for p in params if adopt(p))
    if moved:
        logger.debug("moved %.2f GB of weights into huge pages", moved / 1e9)
    return moved


def resident_huge_bytes() -> int | None:
    """This process's anonymous memory in huge pages (Linux ``smaps_rollup``), else None."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
