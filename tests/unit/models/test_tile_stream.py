"""The packed layout the int4 and int8-group kernels share (models/native/tile_stream.py):
where a group's code blocks and constants block sit in a tile's stream, and the checks of
both layouts (no kernel runs for these); and the matmul both kernels' modules call, run
through each kernel where this host has it."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from specserve.models.native import int4_native, int8_native, tile_stream
from specserve.models.quant.int4_weight import quantize_int4
from specserve.models.quant.int8_group import Int8GroupWeight


@pytest.mark.parametrize(("block_k", "dtype"), [(8, torch.uint8), (4, torch.int8)])
def test_inline_groups_are_their_code_blocks_then_their_constants(
    block_k: int, dtype: torch.dtype
) -> None:
    tiles, k, gs = 3, 64, 16
    ngroups, bpg = k // gs, gs // block_k
    qweight, scales, code_view, const_view = tile_stream.allocate(
        tiles, k, gs, block_k, dtype, True
    )
    assert qweight.shape == (tiles, ngroups * (bpg + 1), 64) and qweight.dtype == dtype
    assert scales.numel() == 0 and scales.dtype == torch.float16
    codes = torch.arange(tiles * ngroups * bpg * 64).remainder(100).to(dtype)
    code_view.copy_(codes.view(tiles, ngroups, bpg, 64))
    consts = torch.randn(tiles, ngroups, 2, 16).to(torch.float16)
    const_view.copy_(consts)
    # Block j of group g in a tile's stream: codes for j < bpg, then the constants.
    stream = qweight.view(tiles, ngroups, bpg + 1, 64)
    assert torch.equal(stream[:, :, :bpg], codes.view(tiles, ngroups, bpg, 64))
    assert torch.equal(stream[:, :, bpg].view(torch.float16).view(tiles, ngroups, 2, 16), consts)
    assert torch.equal(tile_stream.code_blocks(qweight, gs, block_k), codes.view(tiles, -1, 64))
    assert torch.equal(tile_stream.constants(qweight, gs, block_k), consts)
    assert tile_stream.layout_k(qweight, scales, gs, block_k) == (k, True)


@pytest.mark.parametrize(("block_k", "dtype"), [(8, torch.uint8), (4, torch.int8)])
def test_apart_keeps_the_constants_in_their_own_tensor(block_k: int, dtype: torch.dtype) -> None:
    qweight, scales, code_view, const_view = tile_stream.allocate(2, 64, 32, block_k, dtype, False)
    assert qweight.shape == (2, 64 // block_k, 64) and scales.shape == (2, 2, 2, 16)
    assert code_view.data_ptr() == qweight.data_ptr() and const_view is scales
    assert tile_stream.layout_k(qweight, scales, 32, block_k) == (64, False)


def test_layout_checks_name_what_is_wrong() -> None:
    inline, empty, *_ = tile_stream.allocate(2, 64, 32, 8, torch.uint8, True)  # 10 blocks
    with pytest.raises(ValueError, match="positive multiple of 8"):
        tile_stream.layout_k(inline, empty, 12, 8)
    with pytest.raises(ValueError, match="multiple of 5 blocks"):
        tile_stream.layout_k(inline[:, :9], empty, 32, 8)
    apart, scales, *_ = tile_stream.allocate(2, 64, 32, 8, torch.uint8, False)
    with pytest.raises(ValueError, match="multiple of 8 dividing 64"):
        tile_stream.layout_k(apart, scales, 48, 8)
    with pytest.raises(ValueError, match="scales must be fp16"):
        tile_stream.layout_k(apart, scales.float(), 32, 8)
    with pytest.raises(ValueError, match="scales must be fp16"):
        tile_stream.layout_k(apart, scales[:1], 32, 8)


def _packed(kind: str) -> tile_stream.PackedTiles:
    gen = torch.Generator().manual_seed(0)
    if kind == "int4":
        return int4_native.pack(quantize_int4(torch.randn(32, 64, generator=gen) * 0.05, 64))
    codes = torch.randint(-128, 128, (32, 64), dtype=torch.int8, generator=gen)
    scale = torch.rand(32, 4, generator=gen) * 0.01 + 1e-3
    return int8_native.pack(Int8GroupWeight(codes, scale, torch.zeros(32, 4), 16))


@pytest.mark.parametrize(("kind", "module"), [("int4", int4_native), ("int8-group", int8_native)])
def test_matmul_takes_any_leading_shape_and_names_bad_input(kind: str, module: ModuleType) -> None:
    """Leading dimensions flatten into rows (the same rows' results); a wrong dtype, width or
    a scalar is a ValueError naming the kernel, raised before the kernel runs."""
    if not module.available():
        pytest.skip(f"native {kind} kernel: {module.unavailable_reason()}")
    packed = _packed(kind)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    y = module.matmul(x, packed)
    assert y.shape == (2, 3, 32)
    assert torch.equal(y.view(6, 32), module.matmul(x.view(6, 64), packed))
    for bad in (x.half(), torch.randn(2, 63, dtype=torch.bfloat16), torch.tensor(1.0)):
        with pytest.raises(ValueError, match=f"{kind} matmul takes CPU bf16 / fp32 inputs"):
            module.matmul(bad, packed)
