"""The ``gguf`` weight format's portable state: a GGUF file's codes and scales as stored.

:func:`stored_state` decodes every block-quantised linear and the token embedding of a GGUF
file with :mod:`specserve.loading.gguf_blocks` and names the tensors as
``models/quant/stored.py`` expects. Tensors of a type without a native mapping (Q2_K, Q3_K,
...) are left out, so their modules keep the float weights the loader dequantised, and the
types are logged once per file, naming them: their numbers are rounded to the compute dtype,
never silently.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import numpy as np
import torch

from specserve.config import WeightFormat
from specserve.loading.catalog import CATALOG
from specserve.loading.errors import CorruptModelError
from specserve.loading.gguf_blocks import FLOAT_TYPES, StoredBlocks, decode
from specserve.loading.gguf_loader import GGUFFile, _unpermute_rope_rows, hf_name
from specserve.loading.loader import resolve_source
from specserve.models.arch import ArchConfig
from specserve.models.quant.int4_weight import pack_nibbles

logger = logging.getLogger(__name__)

FORMAT: WeightFormat = "gguf"


def is_quantised_gguf(path: Path) -> bool:
    """Whether ``path`` is a GGUF file whose linears are block-quantised (not all float).

    Parsing a GGUF's metadata takes seconds for a large vocabulary, and a start asks this for
    the default format and again when loading, so the answer is kept per file version."""
    if path.suffix != ".gguf" or not path.is_file():
        return False
    st = path.stat()
    return _quantised(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _quantised(path: str, size: int, mtime_ns: int) -> bool:
    reader = GGUFFile(path).reader
    return any(
        t.tensor_type not in FLOAT_TYPES and len(t.shape) == 2 and t.name.endswith(".weight")
        for t in reader.tensors
    )


def default_format(spec: str, device: str = "cpu", dtype: str | None = None) -> WeightFormat | None:
    """The weight format a model runs in when none is asked for: ``gguf`` for a quantised
    GGUF file (catalog models are) on CPU unless the compute dtype asked for is fp32 / fp16
    (then its dequantised float weights, the reference numbers); None (the compute dtype's
    float weights) otherwise. A spec that cannot be resolved gives None: loading it reports
    the problem."""
    if device.split(":")[0] != "cpu" or dtype not in (None, "auto", "bfloat16"):
        return None
    if spec not in CATALOG and not spec.endswith(".gguf"):
        return None  # a directory or a repo id: float weights
    try:
        kind, path = resolve_source(spec)
        return FORMAT if kind == "gguf" and is_quantised_gguf(path) else None
    except (OSError, ValueError, RuntimeError):
        return None


def draft_format(
    draft_weights: WeightFormat | None,
    target_weights: WeightFormat | None,
    draft_spec: str,
    device: str = "cpu",
    dtype: str | None = None,
) -> WeightFormat | None:
    """The draft's format: ``draft_weights`` if given; else ``int4`` beside a ``gguf`` or
    ``bf16`` target (or none given) where the native int4 kernels run (CPU, ``dtype`` the
    resolved ``bfloat16``); else the target's, where ``gguf`` (or no format) means the
    draft's own default (:func:`default_format`).

    A draft's numbers never reach the output (the target verifies every token), only its
    cost does: the 0.5B int4 draft drafts a token in about two thirds of its GGUF blocks'
    time with the same acceptance. Through the servers on an AVX-512 host that made serve's
    default pair 1.41-1.91x faster than plain decoding on structured prompts and 1.21-1.23x
    on open-ended ones, against 1.32-1.44x and 0.98-1.10x with the GGUF draft
    (docs/benchmarks.md)."""
    if draft_weights is not None:
        return draft_weights
    if target_weights in (None, FORMAT, "bf16") and _int4_native(device, dtype):
        return "int4"
    if target_weights in (None, FORMAT):
        return default_format(draft_spec, device, dtype)
    return target_weights


def _int4_native(device: str, dtype: str | None) -> bool:
    if device.split(":")[0] != "cpu" or dtype != "bfloat16":
        return False
    from specserve.models.native import int4_native

    return int4_native.available()


def _unpermute(blocks: StoredBlocks, num_heads: int) -> StoredBlocks:
    """llama.cpp's q/k row permutation undone on codes and per-row constants alike."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(_unpermute_rope_rows(t.numpy(), num_heads)))

    return StoredBlocks(
        blocks.kind,
        rows(blocks.codes),
        rows(blocks.scale),
        rows(blocks.offset),
        blocks.group_size,
        blocks.source_type,
    )


def _portable(name: str, blocks: StoredBlocks) -> dict[str, torch.Tensor]:
    if blocks.kind == "int4":
        return {
            f"{name}.nibbles": pack_nibbles(blocks.codes),
            f"{name}.scale": blocks.scale,
            f"{name}.minimum": blocks.offset,
        }
    return {
        f"{name}.codes": blocks.codes,
        f"{name}.scale": blocks.scale,
        f"{name}.offset": blocks.offset,
    }


def stored_state(path: Path, arch: ArchConfig) -> dict[str, torch.Tensor]:
    """The portable ``gguf`` state of the GGUF file at ``path`` (see the module docstring).

    Raises:
        CorruptModelError: a tensor's data does not fit its type and shape.
    """
    t0 = time.perf_counter()
    gguf = GGUFFile(path)
    state: dict[str, torch.Tensor] = {}
    fallback: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for t in gguf.reader.tensors:
        if len(t.shape) != 2 or t.tensor_type in FLOAT_TYPES:
            continue  # norms, biases and float weights: the loader's tensors are exact
        shape = (int(t.shape[1]), int(t.shape[0]))  # GGUF lists the row length first
        try:
            blocks = decode(t.data, t.tensor_type, shape)
        except ValueError as e:
            raise CorruptModelError(f"tensor {t.name!r} of {path.name}: {e}") from e
        if blocks is None:
            fallback.setdefault(t.tensor_type.name, []).append(t.name)
            continue
        if gguf.architecture == "llama":
            if t.name.endswith(".attn_q.weight"):
                blocks = _unpermute(blocks, arch.num_heads)
            elif t.name.endswith(".attn_k.weight"):
                blocks = _unpermute(blocks, arch.num_kv_heads)
        name = hf_name(t.name).removesuffix(".weight")
        state.update(_portable(name, blocks))
        counts[blocks.source_type] = counts.get(blocks.source_type, 0) + 1
    for qtype, names in fallback.items():
        logger.warning(
            "%s: GGUF type %s has no native kernel; %d tensor(s) (%s%s) run dequantised in the "
            "compute dtype instead of as stored",
            path.name,
            qtype,
            len(names),
            names[0],
            ", ..." if len(names) > 1 else "",
        )
    logger.info(
        "decoded %s as stored (%s) in %.1f s",
        path.name,
        ", ".join(f"{n} {q}" for q, n in sorted(counts.items())),
        time.perf_counter() - t0,
    )
    return state
