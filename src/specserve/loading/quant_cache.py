"""Load a model in a chosen weight format (``fp32``/``bf16``/``int8``/``int4``/``gguf``),
caching the quantised tensors on disk so that the second start skips quantisation.

``gguf`` is not a quantisation: it keeps a GGUF file's block codes and scales as stored
(``loading/gguf_stored.py``, ``models/quant/stored.py``); the cache then saves decoding them.

Layout: ``$SPECSERVE_CACHE_DIR/quant/<stem>-<key>.<format>[-g<group>].safetensors`` holding
the portable tensors of ``models/quant/quantize.py``. ``key`` hashes the model source's resolved
path, size and mtime (a directory: its ``*.safetensors``/``*.gguf`` files), the group size and
a format version. A cached start memory-maps the float weights without touching the linears
(``load_model`` maps them copy-on-write), reads the quantised file and drops the float
weights, so peak memory stays near the quantised size.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specserve.config import WeightFormat
from specserve.dtypes import FLOAT_WEIGHT_FORMATS
from specserve.loading import gguf_stored
from specserve.loading.loader import LoadedModel, load_model
from specserve.models.quant.int4_weight import DEFAULT_GROUP_SIZE
from specserve.models.quant.quantize import QUANT_FORMATS, apply_quantized, quantize_weights
from specserve.models.quant.stored import apply_stored
from specserve.paths import cache_root

logger = logging.getLogger(__name__)

CACHE_VERSION = 1


def compute_dtype_for(weights: WeightFormat, dtype: torch.dtype | None) -> torch.dtype:
    """The activation dtype: fp32/bf16 formats fix it; int8/int4/gguf default to bf16 (the
    CPU packed kernels are fast for bf16 activations, far slower for fp32)."""
    if weights in FLOAT_WEIGHT_FORMATS:
        want = FLOAT_WEIGHT_FORMATS[weights]
        if dtype is not None and dtype != want:
            raise ValueError(f"weights={weights!r} runs in {want}, but dtype={dtype} was asked")
        return want
    return dtype or torch.bfloat16


def _source_key(source: Path, group_size: int) -> str:
    files = (
        [source]
        if source.is_file()
        else sorted(p for p in source.iterdir() if p.suffix in (".safetensors", ".gguf", ".bin"))
    )
    h = hashlib.sha256(f"{CACHE_VERSION}|{group_size}".encode())
    for f in files:
        st = f.stat()
        h.update(f"|{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def quant_cache_file(
    source: Path, fmt: str, group_size: int, cache_dir: Path | None = None
) -> Path:
    """Where the quantised tensors of ``source`` in format ``fmt`` are cached."""
    directory = cache_dir if cache_dir is not None else cache_root() / "quant"
    directory.mkdir(parents=True, exist_ok=True)
    suffix = f"{fmt}-g{group_size}" if fmt == "int4" else fmt
    return directory / f"{source.stem}-{_source_key(source, group_size)}.{suffix}.safetensors"


def _save_atomic(path: Path, state: dict[str, torch.Tensor]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in state.items()}, tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


class _LazyTensors(Mapping[str, torch.Tensor]):
    """The tensors of a safetensors file, each read only when asked for.

    ``apply_quantized`` builds one layer at a time, so reading lazily keeps a single layer's
    portable tensors in memory next to the packed model instead of the whole file.
    """

    def __init__(self, path: Path) -> None:
        self._file: Any = safe_open(str(path), framework="pt")
        self._names = list(self._file.keys())

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        return self._file.get_tensor(name)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def _fix_malloc_mmap_threshold(size: int = 1 << 20) -> bool:
    """Make glibc serve every allocation >= ``size`` by mmap, returned to the OS on free.

    By default glibc raises this threshold after the first large block is freed, so the
    packing temporaries of later layers land in the heap, which it never shrinks: loading
    the int4 0.5B peaked at 2.2 GiB and kept 1.8 GiB resident for 0.4 GiB of weights;
    with a fixed threshold it peaks at 1.0 GiB. Process-wide and best effort: False where
    the C library has no ``mallopt`` (not glibc).
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, size))


def load_model_with_weights(
    spec: str | Path,
    weights: WeightFormat = "bf16",
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    group_size: int = DEFAULT_GROUP_SIZE,
    use_cache: bool = True,
    cache_dir: Path | None = None,
) -> LoadedModel:
    """``specserve.loading.load_model`` plus a weight format.

    Args:
        spec: catalog name, ``.gguf`` file, HF directory or repo id (see ``load_model``).
        weights: ``fp32``/``bf16`` (plain float weights), ``int8``/``int4`` (weight-only) or
            ``gguf`` (a quantised GGUF file's codes as stored).
        dtype: activation dtype; None picks the format's (bf16 for int8/int4/gguf).
        device: torch device.
        group_size: int4 group size (input channels per scale).
        use_cache: read/write the quantised tensors under ``$SPECSERVE_CACHE_DIR/quant``.
        cache_dir: another directory for them.
    Raises:
        ValueError: unknown format, a dtype that contradicts a float format, or ``gguf`` for
            a model that is not a quantised GGUF file.
    """
    if weights not in get_args(WeightFormat):
        raise ValueError(f"unknown weight format {weights!r}; choose from {get_args(WeightFormat)}")
    compute = compute_dtype_for(weights, dtype)
    # a quantised format replaces the float weights: leave them mapped, read as quantised
    lm = load_model(spec, dtype=compute, device=device, mapped=weights not in FLOAT_WEIGHT_FORMATS)
    if weights in FLOAT_WEIGHT_FORMATS:
        return lm
    if weights == gguf_stored.FORMAT:
        return _load_stored(lm, use_cache, cache_dir)
    assert weights in QUANT_FORMATS
    t0 = time.perf_counter()
    path = quant_cache_file(lm.source, weights, group_size, cache_dir) if use_cache else None
    state = _cached_state(
        path,
        lambda: quantize_weights(lm.model, weights, group_size),  # type: ignore[arg-type]
        f"{weights} weights of {lm.name}",
    )
    apply_quantized(lm.model, weights, state, group_size)  # type: ignore[arg-type]
    logger.info("%s ready as %s in %.1f s", lm.name, weights, time.perf_counter() - t0)
    return lm


def _cached_state(
    path: Path | None, build: Callable[[], dict[str, torch.Tensor]], what: str
) -> Mapping[str, torch.Tensor]:
    """The portable tensors cached at ``path``, or ``build()``'s, then cached there (no
    cache: ``path`` None)."""
    _fix_malloc_mmap_threshold()
    if path is not None and path.is_file():
        logger.info("read the %s from %s", what, path)
        return _LazyTensors(path)
    state = build()
    if path is not None:
        _save_atomic(path, state)
        logger.info("cached the %s in %s", what, path)
    return state


def _load_stored(lm: LoadedModel, use_cache: bool, cache_dir: Path | None) -> LoadedModel:
    if not gguf_stored.is_quantised_gguf(lm.source):
        raise ValueError(
            f"--weights gguf computes a quantised GGUF file's blocks as stored, but "
            f"{lm.name} comes from {lm.source.name}, which is not one; use int4/int8 "
            "(quantised here) or bf16"
        )
    t0 = time.perf_counter()
    path = quant_cache_file(lm.source, "gguf", 0, cache_dir) if use_cache else None
    state = _cached_state(
        path,
        lambda: gguf_stored.stored_state(lm.source, lm.arch),
        f"stored GGUF blocks of {lm.name}",
    )
    apply_stored(lm.model, state)
    logger.info("%s ready as gguf in %.1f s", lm.name, time.perf_counter() - t0)
    return lm


def load_in_format(
    spec: str | Path,
    weights: WeightFormat | None,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Load ``spec`` for a run whose compute dtype is ``dtype``: ``weights`` None keeps the
    dtype's own float weights; ``fp32``/``bf16`` fix the weights (and activations); ``int8``/
    ``int4`` are weight-only with ``dtype`` activations."""
    if weights is None:
        return load_model(spec, dtype=dtype, device=device)
    act = None if weights in FLOAT_WEIGHT_FORMATS else dtype
    return load_model_with_weights(spec, weights, dtype=act, device=device)
