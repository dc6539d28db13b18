"""A draft model's one-row int4 matmuls with x rounded to int8 (``csrc/int4_gemv.cpp``, the
AVX2 variant; ``int4_native.quantised_x``): the documented arithmetic, which calls take it,
and how a draft model is routed to it (``fused_layer.set_draft``)."""

from __future__ import annotations

from typing import cast

import pytest
import torch

from specserve.models.native import int4_native
from specserve.models.native.int4_native import Int4Packed, pack
from specserve.models.native.tile_stream import QUANTISED_X, TILES_NEVER
from specserve.models.quant.int4_weight import Int4Weight, quantize_int4

native = pytest.mark.skipif(
    not int4_native.available(), reason=f"native int4 kernel: {int4_native.unavailable_reason()}"
)
quantised = pytest.mark.skipif(
    not int4_native.quantised_x(),
    reason="the int4 kernel variant built here has no one-row quantised-x path (AVX2 only)",
)


def _case(n: int, k: int, group_size: int, seed: int) -> tuple[Int4Weight, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weight = quantize_int4(torch.randn(n, k, generator=gen) * 0.05, group_size)
    x = (torch.randn(1, k, generator=gen) * torch.exp(torch.randn(1, k, generator=gen))).to(
        torch.bfloat16
    )
    return weight, x


def _gemm(x: torch.Tensor, packed: Int4Packed, mode: int) -> torch.Tensor:
    return cast(torch.Tensor, torch.ops.specserve.int4_gemm(x, *packed.op_args(1)[:-1], mode))


def _quantised_reference(x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
    """The documented arithmetic in float64: x rounded to int8 per group (fp32 scale
    127 / max |x|, round half to even), codes centred on 8, the offset term on exact x."""
    g = weight.group_size
    xf = x.float().view(-1, g)
    amax = xf.abs().amax(dim=1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    xq = torch.round(xf * inv).double()
    xhat = (xq * (amax / 127.0).double()).view(1, -1)
    q = weight.codes().double()
    s = weight.scale.double().repeat_interleave(g, dim=1)
    m = weight.minimum.double().repeat_interleave(g, dim=1)
    return xhat @ ((q - 8) * s).T + x.double() @ (m + 8 * s).T


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


@native
@quantised
@pytest.mark.parametrize(
    ("n", "k", "group_size", "inline"),
    [
        (37, 64, 32, True),
        (300, 1536, 64, True),
        (300, 1536, 64, False),
        (64, 512, 128, True),
        (48, 1024, 256, True),
        (200, 4864, 32, True),
    ],
)
def test_one_row_follows_the_quantised_arithmetic(
    n: int, k: int, group_size: int, inline: bool
) -> None:
    """Close to the float64 model of the documented arithmetic (fp16 constants and the bf16
    output round it) and several times closer to it than to the exact product: the kernel
    does quantise x, as documented, for every group size (int16 sums widened every 4 blocks:
    groups of 32 to 256 inputs) and both layouts of the constants; N = 37 leaves padding."""
    weight, x = _case(n, k, group_size, seed=n + k)
    packed = pack(weight, inline_constants=inline)
    y = _gemm(x, packed, QUANTISED_X)
    model = _quantised_reference(x, weight)
    exact = x.double() @ weight.dequantize(torch.float64).T
    to_model, to_exact = _rel(y, model), _rel(y, exact)
    assert to_model < 3e-3, to_model
    assert to_exact < 4e-2, to_exact  # heavy-tailed x in groups of up to 256: ~2 %
    assert to_model < to_exact / 2, (to_model, to_exact)


@native
@quantised
def test_zero_groups_and_determinism() -> None:
    """A group of zeros (scale 0) adds nothing; the same call gives the same bits again and
    on one thread as on two."""
    weight, x = _case(40, 256, 64, seed=7)
    x[:, 64:128] = 0
    packed = pack(weight)
    y = _gemm(x, packed, QUANTISED_X)
    assert _rel(y, _quantised_reference(x, weight)) < 3e-3
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = _gemm(x, packed, QUANTISED_X)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(y, alone) and torch.equal(y, _gemm(x, packed, QUANTISED_X))


@native
def test_only_one_row_calls_with_the_flag_quantise() -> None:
    """Calls of several rows keep the exact arithmetic with the flag (each row equals the
    same row without it), as do one-row calls without it; a one-row call with it differs
    only where the kernel has the path."""
    weight, x1 = _case(96, 512, 64, seed=11)
    packed = pack(weight)
    gen = torch.Generator().manual_seed(12)
    x = torch.cat([x1, torch.randn(4, 512, generator=gen).to(torch.bfloat16)])
    op = torch.ops.specserve.int4_gemm
    args = packed.op_args(5)[:-1]
    assert torch.equal(op(x, *args, QUANTISED_X), op(x, *args, TILES_NEVER))
    exact = op(x1, *args, TILES_NEVER)
    assert torch.equal(exact, op(x[:1], *args, TILES_NEVER))
    flagged = op(x1, *args, QUANTISED_X)
    assert torch.equal(flagged, exact) != int4_native.quantised_x()


@native
def test_set_draft_routes_a_drafts_one_row_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fused_layer.set_draft`` flags every packed weight and the fused layers' one-row
    argument; a one-token forward passes the flag to each layer op (and a 5-token one too,
    where the kernel ignores it), the logits move by the quantisation only, and
    ``SPECSERVE_DRAFT_INT8_X=0`` gives the exact logits back (the int16 form here: with int8
    activations, groups of 32 round x as the one-row path does)."""
    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.models.decoder import DecoderLayer
    from specserve.models.native import fused_layer
    from specserve.models.quant.layers import Int4Linear
    from specserve.models.quant.quantize import quantize_model
    from tests.conftest import make_tiny_model

    monkeypatch.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")
    tiny = make_tiny_model("qwen2", hidden_size=128, intermediate_size=192).to(torch.bfloat16)
    model = quantize_model(tiny, "int4", 32)
    assert fused_layer.enable(model), fused_layer.why_not(model)
    layers = [cast("DecoderLayer", layer) for layer in model.model.layers]

    def logits(tokens: list[int]) -> torch.Tensor:
        cache = SingleSequenceCache(model, 32)
        return model.compute_logits(cache.forward(tokens)).float()

    exact = logits([5])
    fused_layer.set_draft(model)
    down = model.get_submodule("model.layers.0.mlp.down_proj")
    assert isinstance(down, Int4Linear) and down.native is not None and down.native.quantised_x
    assert all(la.fused is not None and la.fused.short_mode & QUANTISED_X for la in layers)
    layer_op = torch.ops.specserve.int4_decoder_layer
    calls: list[tuple[int, int]] = []

    def spy(rows: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append((rows.shape[0], int(cast(int, args[-1])) & QUANTISED_X))
        return cast(torch.Tensor, layer_op(rows, *args))

    monkeypatch.setattr(torch.ops.specserve, "int4_decoder_layer", spy)
    one, five = logits([5]), logits([5, 17, 3, 9, 11])
    assert set(calls) == {(1, QUANTISED_X), (5, QUANTISED_X)}
    if int4_native.quantised_x():
        assert not torch.equal(one, exact)
        assert _rel(one, exact.double()) < 0.05
        assert fused_layer.describe(model).endswith(", x in int8 for one-row int4 matmuls")
    else:
        assert torch.equal(one, exact)
    monkeypatch.setenv("SPECSERVE_DRAFT_INT8_X", "0")
    fused_layer.set_draft(model)
    assert not down.native.quantised_x
    assert torch.equal(logits([5]), exact)
    # several rows: the flag changed nothing (they may take the AMX tiles as a draft's, so
    # not necessarily the bits of before set_draft)
    assert torch.equal(logits([5, 17, 3, 9, 11]), five)
    # where the CPU has the AMX tiles, a draft's calls of several rows still take them
    tiles = f" on AMX tiles from {fused_layer.DRAFT_TILE_ROWS} rows"
    expected = "native int4_decoder_layer" + (
        tiles if int4_native.amx_tiles(switched=False) else ""
    )
    # and where the kernel multiplies int8 activations (AVX-512 VNNI), every call of its groups
    expected += ", int4 groups on int8 x" if int4_native.int8_activations() else ""
    assert fused_layer.describe(model) == expected
