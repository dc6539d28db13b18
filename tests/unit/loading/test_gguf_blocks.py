"""GGUF blocks decode to codes and constants that reproduce llama.cpp's dequantisation exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from specserve.loading import gguf_blocks

# byte ranges holding fp16 constants (d, dmin, m) per block; the rest may be any bytes
_F16_AT = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}
_SIZES = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24, Q.Q8_0: 34}
_SIZES |= {Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}
_WEIGHTS = {t: (256 if t in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 32) for t in _SIZES}


def _random_tensor(qtype: Q, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random bytes for every code and packed scale, finite fp16 constants of either sign."""
    rng = np.random.default_rng(seed)
    blocks = n * k // _WEIGHTS[qtype]
    raw = rng.integers(0, 256, size=(blocks, _SIZES[qtype]), dtype=np.uint8)
    for at in _F16_AT[qtype]:
        values = (rng.standard_normal(blocks) * 0.01).astype(np.float16)
        raw[:, at : at + 2] = values.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype", sorted(_SIZES, key=lambda t: t.name), ids=lambda t: t.name)
def test_codes_times_scales_equal_llama_cpp_dequantisation_bit_for_bit(qtype: Q) -> None:
    n, k = 6, 512
    raw = _random_tensor(qtype, n, k)
    stored = gguf_blocks.decode(raw, qtype, (n, k))
    assert stored is not None and stored.source_type == qtype.name
    reference = torch.from_numpy(np.asarray(dequantize(raw, qtype), dtype=np.float32))
    assert torch.equal(stored.dequantize(), reference.view(n, k))


@pytest.mark.parametrize(
    ("qtype", "kind", "group", "low", "high"),
    [
        (Q.Q4_0, "int4", 32, 0, 15),
        (Q.Q4_K, "int4", 32, 0, 15),
        (Q.Q5_0, "int8", 32, -16, 15),
        (Q.Q5_K, "int8", 32, 0, 31),
        (Q.Q6_K, "int8", 16, -32, 31),
        (Q.Q8_0, "int8", 32, -128, 127),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_code_ranges_and_groups(qtype: Q, kind: str, group: int, low: int, high: int) -> None:
    stored = gguf_blocks.decode(_random_tensor(qtype, 4, 256, seed=1), qtype, (4, 256))
    assert stored is not None
    assert (stored.kind, stored.group_size) == (kind, group)
    assert stored.codes.dtype == (torch.uint8 if kind == "int4" else torch.int8)
    assert int(stored.codes.min()) >= low and int(stored.codes.max()) <= high
    assert stored.scale.shape == stored.offset.shape == (4, 256 // group)


def test_types_without_a_mapping_return_none() -> None:
    assert gguf_blocks.decode(np.zeros(84, dtype=np.uint8), Q.Q2_K, (1, 256)) is None


def test_a_truncated_tensor_is_an_error_naming_the_sizes() -> None:
    raw = _random_tensor(Q.Q8_0, 2, 64)[:, :-1]
    with pytest.raises(ValueError, match=r"Q8_0 \[2, 64\] needs 136 bytes, got 134"):
        gguf_blocks.decode(raw, Q.Q8_0, (2, 64))
    with pytest.raises(ValueError, match="multiple of 256"):
        gguf_blocks.decode(np.zeros(144, dtype=np.uint8), Q.Q4_K, (2, 128))
