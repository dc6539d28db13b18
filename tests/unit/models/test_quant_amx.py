"""Int4 and six-bit weights on the AMX tiles (``csrc/quant_amx.cpp``, ``SPECSERVE_QUANT_AMX=1``):
the switch, accuracy against a float64 reference and beside the ``vdpbf16ps`` kernels, rows
bit-identical whatever the batch, the thread split and the layout of the constants, and a
fused decoder layer whose verify rows equal its one-token steps. Skipped where the library has
no tile kernels (a CPU without AMX BF16)."""

from __future__ import annotations

from typing import cast

import pytest
import torch

from specserve.models.native import build, int4_native, int8_native, six_bit
from tests.unit.models.test_int4_native import _random_codes_weight
from tests.unit.models.test_int8_six_bit import _weight as _six_bit_weight

_, _FLAGS = build.cpu_signature()
_TILE_FLAGS = ("amx_tile", "amx_bf16", "avx512bw", "avx512_bf16", "avx512vbmi", "gfni")


def _tiles_possible() -> bool:
    available = int4_native.available() and int8_native.available()
    return available and all(f in _FLAGS for f in _TILE_FLAGS)


tiles = pytest.mark.skipif(not _tiles_possible(), reason="no AMX BF16 tile kernels on this CPU")


@pytest.fixture
def on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "1")


def test_the_switch_is_off_unless_set_to_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSERVE_QUANT_AMX", raising=False)
    assert not int4_native.amx_tiles()
    for value in ("0", "", "yes", "2"):
        monkeypatch.setenv("SPECSERVE_QUANT_AMX", value)
        assert not int4_native.amx_tiles(), value
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "1")
    assert int4_native.amx_tiles() == _tiles_possible()
    for value in ("0", "1"):  # a draft's calls of several rows: wherever the CPU has them
        monkeypatch.setenv("SPECSERVE_QUANT_AMX", value)
        assert int4_native.amx_tiles(switched=False) == _tiles_possible()


@tiles
def test_six_bit_codes_run_as_bf16_pairs_on_the_tiles(
    monkeypatch: pytest.MonkeyPatch, on: None
) -> None:
    monkeypatch.setenv("SPECSERVE_INT8_AVX512", "0")  # the fp32 kernels' switch: not the tiles'
    assert six_bit.dot_products()


def _check(y: torch.Tensor, ref: torch.Tensor) -> None:
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2


@tiles
@pytest.mark.parametrize(
    ("n", "k", "gs"), [(16 * 7 + 5, 256, 32), (48, 1536, 64), (37, 896, 128), (24, 8960, 32)]
)
def test_int4_rows_are_batch_invariant_and_close(
    monkeypatch: pytest.MonkeyPatch, on: None, n: int, k: int, gs: int
) -> None:
    """Every M from 1 to 20 (one and two row blocks of up to 16), bf16 and fp32 outputs, both
    layouts of the constants, 1 and 2 threads: each row the bits of its 1-row call; close to
    float64 and to the vdpbf16ps kernel (other sums)."""
    weight = _random_codes_weight(n, k, gs)
    packed, apart = int4_native.pack(weight), int4_native.pack(weight, inline_constants=False)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(20, k, generator=gen).to(torch.bfloat16)
    ref = x.double() @ weight.dequantize(torch.float64).T
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = torch.cat([int4_native.matmul(x[i : i + 1], packed) for i in range(20)])
        torch.set_num_threads(2)
        for m in range(1, 21):
            y = int4_native.matmul(x[:m], packed)
            assert torch.equal(y, single[:m]), m
            assert torch.equal(int4_native.matmul(x[:m], apart), y), m  # the same arithmetic
        y32 = int4_native.matmul(x.float(), packed)
        assert torch.equal(y32.to(torch.bfloat16), single)  # bf16 out: the fp32 sums rounded
    finally:
        torch.set_num_threads(threads)
    _check(single, ref)
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "0")
    monkeypatch.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")  # vdpbf16ps, not the int8-x kernel
    other = int4_native.matmul(x, packed)
    assert ((single.float() - other.float()).abs() <= other.float().abs() / 64 + 1e-3).all()


@tiles
@pytest.mark.parametrize(("n", "k", "gs"), [(16 * 21 + 5, 1536, 16), (37, 896, 32), (19, 64, 64)])
def test_six_bit_rows_are_batch_invariant_and_close(
    monkeypatch: pytest.MonkeyPatch, on: None, n: int, k: int, gs: int
) -> None:
    weight = _six_bit_weight(n, k, gs)
    packed = int8_native.pack(weight)
    assert packed.code_bits == 6
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(20, k, generator=gen) * 3).to(torch.bfloat16)
    single = torch.cat([int8_native.matmul(x[i : i + 1], packed) for i in range(20)])
    for m in (2, 3, 5, 9, 16, 17, 20):
        assert torch.equal(int8_native.matmul(x[:m], packed), single[:m]), m
    _check(single, x.double() @ weight.dequantize(torch.float64).T)
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "0")
    other = int8_native.matmul(x, packed)
    assert ((single.float() - other.float()).abs() <= other.float().abs() / 64 + 1e-3).all()


@tiles
def test_byte_codes_stay_on_their_kernel(monkeypatch: pytest.MonkeyPatch, on: None) -> None:
    """Byte codes (Q8_0, Q5_K in the int8 layout) have no tile variant: the same bits with the
    switch on and off."""
    weight = _six_bit_weight(40, 256, 32)
    packed = int8_native.pack(weight, code_bits=8)
    x = torch.randn(5, 256).to(torch.bfloat16)
    y = int8_native.matmul(x, packed)
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "0")
    assert torch.equal(int8_native.matmul(x, packed), y)


@tiles
def test_allow_tiles_routes_a_models_matmuls(monkeypatch: pytest.MonkeyPatch, on: None) -> None:
    """``fused_layer.allow_tiles(model, False)`` puts every packed weight and the fused layers'
    arguments back on the vdpbf16ps kernels: the bits of the switch off; allowed again, the
    tiles' bits. With ``from_rows`` (a draft model's), calls of fewer rows give the bits of
    the switch off and calls of as many rows or more the tiles' bits, in the matmul ops and in
    the fused layers alike, and with the switch off too."""
    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.models.decoder import DecoderLayer
    from specserve.models.native import fused_layer
    from specserve.models.quant.layers import Int4Linear
    from specserve.models.quant.quantize import quantize_model
    from tests.conftest import make_tiny_model

    tiny = make_tiny_model("qwen2", hidden_size=128, intermediate_size=192).to(torch.bfloat16)
    model = quantize_model(tiny, "int4", 32)
    assert fused_layer.enable(model), fused_layer.why_not(model)
    down = model.get_submodule("model.layers.0.mlp.down_proj")
    assert isinstance(down, Int4Linear) and down.native is not None
    packed = down.native
    g = torch.Generator().manual_seed(3)
    # spread exponents: sums of a few rows of plain normal inputs can come out exact both ways
    x = torch.randn(16, packed.in_features, generator=g)
    x *= torch.exp(torch.randn(16, packed.in_features, generator=g))

    def outputs(rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:  # fp32: the last bits show
        cache = SingleSequenceCache(model, 32)
        tokens = [5, 17, 3, 9, 11, 2][:rows]
        return int4_native.matmul(x[:rows], packed), model.compute_logits(cache.forward(tokens))

    on_tiles = {rows: outputs(rows) for rows in (3, 4)}
    assert fused_layer.describe(model) == "native int4_decoder_layer on AMX tiles"
    # calls off the tiles multiply int8 activations where the kernel has them (AVX-512 VNNI)
    x8 = ", int4 groups on int8 x" if int4_native.int8_activations() else ""
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "0")
    off = {rows: outputs(rows) for rows in (3, 4)}
    assert fused_layer.describe(model) == "native int4_decoder_layer" + x8
    for rows in (3, 4):  # other sums: the tiles did run
        assert not torch.equal(on_tiles[rows][0], off[rows][0])
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "1")
    fused_layer.allow_tiles(model, False)
    layers = [cast("DecoderLayer", layer) for layer in model.model.layers]
    assert not packed.tiles and all(la.fused and la.fused.args[-1] == 0 for la in layers)
    assert all(torch.equal(a, b) for a, b in zip(outputs(), off[3], strict=True))
    assert fused_layer.describe(model) == "native int4_decoder_layer" + x8
    fused_layer.allow_tiles(model, True)
    assert all(torch.equal(a, b) for a, b in zip(outputs(), on_tiles[3], strict=True))
    fused_layer.allow_tiles(model, True, from_rows=4)  # a draft's
    assert packed.tiles_from_rows == 4
    assert all(la.fused and la.fused.tiles_from_rows == 4 for la in layers)
    assert fused_layer.describe(model) == "native int4_decoder_layer on AMX tiles from 4 rows" + x8
    layer_op = torch.ops.specserve.int4_decoder_layer
    calls: list[tuple[int, bool]] = []  # (rows, tiles) of each fused layer call

    def spy(rows: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append((rows.shape[0], int(cast(int, args[-1]))))
        return layer_op(rows, *args)

    monkeypatch.setattr(torch.ops.specserve, "int4_decoder_layer", spy)
    assert all(torch.equal(a, b) for a, b in zip(outputs(3), off[3], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(outputs(4), on_tiles[4], strict=True))
    assert set(calls) == {(3, 0), (4, 2)}  # TILES_NEVER, TILES_PERMITTED
    monkeypatch.setenv("SPECSERVE_QUANT_AMX", "0")  # a draft's need no switch
    assert fused_layer.describe(model) == "native int4_decoder_layer on AMX tiles from 4 rows" + x8
    assert all(torch.equal(a, b) for a, b in zip(outputs(4), on_tiles[4], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(outputs(3), off[3], strict=True))
    with pytest.raises(ValueError, match="from_rows"):
        fused_layer.allow_tiles(model, True, from_rows=0)
