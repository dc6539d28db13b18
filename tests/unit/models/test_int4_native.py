"""Native int4 CPU kernel: layout, accuracy against a float64 reference, bit-exact batch
invariance, padding of N, argument errors and the ``SPECSERVE_INT4_NATIVE=0`` switch."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from specserve.models.native import int4_native
from specserve.models.native.int4_native import Int4Packed, matmul, pack
from specserve.models.quant.int4_weight import Int4Weight, quantize_int4
from tests.kernel_checks import (
    assert_exact_and_batch_invariant,
    assert_int8_activation_edges,
    assert_int8_activations_switch_off,
    int8_activation_product,
)

native = pytest.mark.skipif(
    not int4_native.available(), reason=f"native int4 kernel: {int4_native.unavailable_reason()}"
)


def _weight(n: int, k: int, group_size: int = 64, seed: int = 0) -> Int4Weight:
    gen = torch.Generator().manual_seed(seed)
    return quantize_int4(torch.randn(n, k, generator=gen) * 0.05, group_size)


def _random_codes_weight(n: int, k: int, group_size: int, seed: int = 0) -> Int4Weight:
    """Random codes and scales (cheaper than quantising, for big shapes)."""
    gen = torch.Generator().manual_seed(seed)
    nibbles = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    scale = torch.rand(n, k // group_size, generator=gen) * 0.01 + 1e-3
    minimum = -7.5 * scale + torch.randn(n, k // group_size, generator=gen) * 1e-3
    return Int4Weight(nibbles, scale, minimum, group_size)


def _reference(x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
    """The float64 product the kernel approximates: on int8 activations (AVX-512 VNNI, groups
    of a multiple of 32) the codes centred on 8 meet x rounded per 32 inputs, the offsets (8
    scales included) the exact x; else the exact product."""
    w = weight.dequantize(torch.float64)
    if int4_native.int8_activations() and weight.group_size % 32 == 0:
        return int8_activation_product(x, w, weight.minimum + 8 * weight.scale)
    return x.double() @ w.T


def _check_close(y: torch.Tensor, ref: torch.Tensor) -> None:
    """Within bf16 rounding of the output: compare with rounding the exact result to bf16."""
    err = (y.double() - ref).norm() / ref.norm()
    rounding = (ref.to(torch.bfloat16).double() - ref).norm() / ref.norm()
    assert err <= 2.0 * rounding + 1e-4, (float(err), float(rounding))
    worst = (y.double() - ref).abs().max() / ref.abs().max()
    assert worst < 2e-2, float(worst)


# ---------------------------------------------------------------- layout (no kernel) --------


@pytest.mark.parametrize("inline", [True, False])
def test_pack_layout_and_padding(inline: bool) -> None:
    n, k, gs = 21, 64, 32
    weight = _weight(n, k, gs)
    packed = pack(weight, inline_constants=inline)
    assert packed.inline_constants is inline
    if inline:  # the same codes and constants as the layout with the constants apart
        assert packed.qweight.shape == (2, k // 8 + k // gs, 64) and packed.scales.numel() == 0
        split = pack(weight, inline_constants=False)
        assert torch.equal(packed.code_blocks(), split.qweight)
        assert torch.equal(packed.constants(), split.scales)
    else:
        assert packed.qweight.shape == (2, k // 8, 64)
        assert packed.scales.shape == (2, k // gs, 2, 16)
    assert packed.qweight.dtype == torch.uint8 and packed.scales.dtype == torch.float16
    assert packed.row_scale.shape == (32,) and packed.out_features == n
    assert packed.in_features == k
    codes = weight.codes()
    # Decode the documented byte order back into codes.
    q = packed.code_blocks().view(2, k // 8, 4, 2, 4, 2)  # [T, B, L, h, t, e]
    for nib, shift in ((0, 0), (1, 4)):
        v = (q >> shift) & 0xF
        v = v.permute(0, 2, 4, 1, 3, 5).reshape(32, k // 8, 2, 2)  # [row, B, h, e]
        ks = torch.arange(k // 8)[:, None, None] * 8 + nib * 4 + torch.arange(4).view(1, 2, 2)
        assert torch.equal(v[:n], codes[:, ks])
        assert not v[n:].any()  # padding rows are zero
    scale = packed.constants()[:, :, 0].permute(0, 2, 1).reshape(32, -1).float()
    mid = packed.constants()[:, :, 1].permute(0, 2, 1).reshape(32, -1).float()
    rs = packed.row_scale[:, None]
    torch.testing.assert_close(scale[:n] * rs[:n], weight.scale, rtol=1e-3, atol=0)
    expected_mid = weight.minimum + 7.5 * weight.scale
    assert ((mid[:n] * rs[:n] - expected_mid).abs() <= 1e-3 * rs[:n]).all()  # fp16 of mid / rs
    assert not scale[n:].any() and not mid[n:].any()
    assert torch.equal(packed.row_scale[n:], torch.ones(32 - n))
    exp = torch.frexp(packed.row_scale).exponent
    assert torch.equal(packed.row_scale, torch.ldexp(torch.ones(32), exp - 1))  # powers of two


def test_pack_rejects_unsupported_group_size() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        pack(_weight(16, 60, group_size=6))


@pytest.mark.parametrize("inline", [True, False])
def test_packed_validates_its_tensors(inline: bool) -> None:
    packed = pack(_weight(20, 64), inline_constants=inline)
    with pytest.raises(ValueError, match="out_features"):
        Int4Packed(packed.qweight, packed.scales, packed.row_scale, 40, 64)
    with pytest.raises(ValueError, match="scales"):
        Int4Packed(packed.qweight, packed.scales.float(), packed.row_scale, 20, 64)
    with pytest.raises(ValueError, match="qweight"):
        Int4Packed(packed.qweight.view(-1), packed.scales, packed.row_scale, 20, 64)
    with pytest.raises(ValueError, match="blocks per tile" if inline else "dividing 64"):
        Int4Packed(packed.qweight, packed.scales, packed.row_scale, 20, 24)
    if inline:  # 9 blocks are not whole groups of 4 code blocks and their constants
        with pytest.raises(ValueError, match="multiple of 5 blocks"):
            Int4Packed(packed.qweight[:, :9].contiguous(), packed.scales, packed.row_scale, 20, 32)


def test_available_is_true_or_logs_a_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SPECSERVE_INT4_NATIVE", raising=False)
    monkeypatch.setattr(int4_native._kernel, "state", {})  # decide again (reuses a loaded library)
    with caplog.at_level(logging.WARNING, logger=int4_native.__name__):
        ok = int4_native.available()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if ok:
        assert int4_native.unavailable_reason() is None and not warnings
    else:
        reason = int4_native.unavailable_reason()
        assert reason and len(warnings) == 1 and reason in warnings[0]


def test_env_switch_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_INT4_NATIVE", "0")
    monkeypatch.setattr(int4_native._kernel, "state", {})  # as in a fresh process
    assert not int4_native.available()
    assert "SPECSERVE_INT4_NATIVE" in (int4_native.unavailable_reason() or "")
    assert int4_native._kernel.state == {}  # nothing was built or loaded
    packed = pack(_weight(16, 64))
    with pytest.raises(RuntimeError, match="not loaded"):
        matmul(torch.randn(1, 64, dtype=torch.bfloat16), packed)


def test_failed_build_reports_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(int4_native._kernel, "state", {})
    monkeypatch.setattr(int4_native, "_load", lambda: "build failed: no compiler")
    with caplog.at_level(logging.WARNING, logger=int4_native.__name__):
        assert not int4_native.available()
        assert not int4_native.available()
    assert int4_native.unavailable_reason() == "build failed: no compiler"
    assert sum("no compiler" in r.getMessage() for r in caplog.records) == 1  # logged once


# ---------------------------------------------------------------- kernel --------------------


@native
@pytest.mark.parametrize(
    ("n", "k", "gs"),
    [
        (1007, 896, 64),
        (64, 1536, 32),
        (48, 1536, 128),
        (37, 4864, 64),
        (24, 8960, 64),
        (5, 256, 16),
    ],
)
def test_matches_float64_reference(n: int, k: int, gs: int) -> None:
    weight = _weight(n, k, gs)
    packed = pack(weight)
    split = pack(weight, inline_constants=False)
    gen = torch.Generator().manual_seed(1)
    for m in (1, 2, 3, 5, 11):
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        y = matmul(x, packed)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        _check_close(y, _reference(x, weight))
        assert torch.equal(y, matmul(x, split)), m  # the two layouts: the same arithmetic


@native
def test_fp32_input_gives_fp32_output_of_the_bf16_rounded_input() -> None:
    weight = _weight(40, 256)
    packed = pack(weight)
    x = torch.randn(3, 256)
    y = matmul(x, packed)
    assert y.dtype == torch.float32 and y.shape == (3, 40)
    ref = _reference(x.to(torch.bfloat16), weight)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-3  # fp16 scales, fp32 sums
    assert torch.equal(y.to(torch.bfloat16), matmul(x.to(torch.bfloat16), packed))


@native
def test_leading_dims_and_empty_batch() -> None:
    packed = pack(_weight(20, 128))
    x = torch.randn(2, 3, 128, dtype=torch.bfloat16)
    y = matmul(x, packed)
    assert y.shape == (2, 3, 20)
    assert torch.equal(y.view(6, 20), matmul(x.view(6, 128), packed))
    assert matmul(torch.empty(0, 128, dtype=torch.bfloat16), packed).shape == (0, 20)


@native
def test_large_magnitude_weights_keep_their_precision() -> None:
    """The per-row power-of-two row_scale keeps fp16 scales in range."""
    weight = _weight(32, 128)
    big = Int4Weight(weight.nibbles, weight.scale * 1e6, weight.minimum * 1e6, 64)
    tiny = Int4Weight(weight.nibbles, weight.scale * 1e-9, weight.minimum * 1e-9, 64)
    x = torch.randn(2, 128).to(torch.bfloat16)
    for w in (big, tiny):
        _check_close(matmul(x, pack(w)), _reference(x, w))


@native
@pytest.mark.parametrize(("n", "k", "gs"), [(1000 + 7, 1536, 64), (53, 896, 32), (40, 512, 128)])
@pytest.mark.parametrize("inline", [True, False])
def test_batch_invariance_is_bit_exact(n: int, k: int, gs: int, inline: bool) -> None:
    """Row m of an M-row call equals the 1-row call, whatever M and the other rows are."""
    packed = pack(_random_codes_weight(n, k, gs), inline_constants=inline)
    gen = torch.Generator().manual_seed(2)
    probe = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    single = matmul(probe, packed)
    for m in [*range(1, 17), 40]:
        for pos in {0, m // 2, m - 1}:
            x = (torch.randn(m, k, generator=gen) * 10).to(torch.bfloat16)
            x[pos] = probe[0]
            y = matmul(x, packed)
            assert torch.equal(y[pos : pos + 1], single), (m, pos)


@native
@pytest.mark.parametrize(
    "switch",
    [
        "SPECSERVE_SWEEP_PREFETCH",
        "SPECSERVE_ONE_TILE_PREFETCH",
        "SPECSERVE_PREFETCH_L2",
        "SPECSERVE_AVX2_PREFETCH",
    ],
)
def test_prefetch_switches_change_no_bit(monkeypatch: pytest.MonkeyPatch, switch: str) -> None:
    """Where the kernels prefetch moves reads only: the sweep of the 2- and 3-row kernels, on
    (the default) or off, and the distance of the one-tile runs (4 or more rows, the last
    tiles of fewer), far (the default) or as the others', the cache level the lines go
    to (L2 by default on AVX-512, or L1), and on AVX2 whether the kernel on int8 activations
    prefetches at all, give the same bits on every path, in both layouts."""
    gen = torch.Generator().manual_seed(5)
    for (n, k, gs), inline in itertools.product(
        ((16 * 29 + 9, 1536, 32), (16 * 9, 512, 64)), (True, False)
    ):
        packed = pack(_random_codes_weight(n, k, gs), inline_constants=inline)
        for m in (1, 2, 3, 4, 5, 9):
            x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16)
            monkeypatch.setenv(switch, "1")
            on = matmul(x, packed)
            monkeypatch.setenv(switch, "0")
            assert torch.equal(on, matmul(x, packed)), (n, k, inline, m)


# ---------------------------------------------------------- on int8 activations ------------

x8_kernel = pytest.mark.skipif(
    not int4_native.available() or not torch.ops.specserve.int4_int8_activations(),
    reason="int8 activations need the kernel built with AVX-512 VNNI or AVX2",
)


def _as_packed(packed: Int4Packed) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight ``packed`` holds (its fp16 constants times row_scale) in float64, and its
    offsets with the codes centred on 8 (``c + 0.5 s`` per group): what a float64 reference of
    the kernel's arithmetic multiplies."""
    n, k, gs = packed.out_features, packed.in_features, packed.group_size
    codes = int4_native.unpack_code_blocks(packed.code_blocks())[:n].double()
    const = packed.constants().double() * packed.row_scale.double().view(-1, 1, 1, 16)
    scale = const[:, :, 0].permute(0, 2, 1).reshape(-1, k // gs)[:n]
    mid = const[:, :, 1].permute(0, 2, 1).reshape(-1, k // gs)[:n]
    per_input = (codes.view(n, k // gs, gs) - 7.5) * scale[..., None] + mid[..., None]
    return per_input.view(n, k), mid + 0.5 * scale


@x8_kernel
@pytest.mark.parametrize(("n", "k", "gs"), [(37, 512, 64), (160, 1536, 32), (21, 384, 128)])
@pytest.mark.parametrize("inline", [True, False])
def test_int8_activations_match_their_float64_reference_and_are_batch_invariant(
    n: int, k: int, gs: int, inline: bool
) -> None:
    """The int4 format's groups on int8 activations (both layouts): fp32 outputs within fp32
    rounding of the float64 product of the same rounding of x, rows of 1 to 11 bit-identical
    to one call (every kernel width, the interleaved tiles of 1-3 rows included)."""
    assert int4_native.int8_activations()
    packed = pack(_random_codes_weight(n, k, gs, seed=n), inline_constants=inline)
    weight, offsets = _as_packed(packed)
    assert_exact_and_batch_invariant(
        matmul, packed, weight, reference=lambda x: int8_activation_product(x, weight, offsets)
    )


@x8_kernel
def test_int8_activations_of_zero_and_non_finite_groups_in_int4_groups() -> None:
    packed = pack(_random_codes_weight(32, 512, 64, seed=4))
    weight, offsets = _as_packed(packed)
    assert_int8_activation_edges(
        matmul, packed, lambda x: int8_activation_product(x, weight, offsets), 512
    )


@x8_kernel
def test_int8_activations_of_int4_groups_stay_near_the_exact_product_and_switch_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Near the exact product (within 1 %), not equal to it; ``SPECSERVE_INT8_ACTIVATIONS=0``
    gives the exact product (to fp32 rounding; on AVX2 to the int16 form's rounding of the
    smallest inputs), and groups of 16 never take int8 activations."""
    # the AVX2 variant (the one with a one-row quantised path) keeps x as int16 steps
    exact_bound = 1e-4 if int4_native.quantised_x() else 1e-5
    packed = pack(_weight(64, 1536, 64, seed=3))
    assert_int8_activations_switch_off(
        matmul, packed, _as_packed(packed)[0], monkeypatch, 1e-2, exact_bound
    )
    monkeypatch.delenv("SPECSERVE_INT8_ACTIVATIONS")
    sixteen = pack(_weight(48, 256, 16, seed=6))
    x = torch.randn(3, 256).to(torch.bfloat16)
    exact = x.double() @ _as_packed(sixteen)[0].T
    y = matmul(x.float(), sixteen).double()
    assert float((y - exact).norm() / exact.norm()) < exact_bound


@x8_kernel
def test_a_gguf_files_per_group_blocks_keep_x_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUF file's Q4_0 / Q4_1 blocks (``stored_linear`` marks their packed weight
    ``exact_x``) keep bf16 activations where the int4 format's groups take int8 ones: the bits
    of ``SPECSERVE_INT8_ACTIVATIONS=0``, in one-row and several-row calls; the flag reaches the
    op as ``EXACT_X`` in the ``tiles`` argument."""
    from specserve.models.native.tile_stream import EXACT_X
    from specserve.models.quant.stored import stored_linear

    weight = _random_codes_weight(48, 512, 32, seed=7)
    linear = stored_linear(weight, None, torch.bfloat16, torch.device("cpu"))
    stored = linear.native
    assert isinstance(stored, Int4Packed) and stored.exact_x
    assert stored.op_args(3)[-1] & EXACT_X and not pack(weight).op_args(3)[-1] & EXACT_X
    x = torch.randn(5, 512).to(torch.bfloat16)
    on = [matmul(x[:m], stored) for m in (1, 5)]
    int8_x = matmul(x, pack(weight))
    monkeypatch.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")
    off = [matmul(x[:m], pack(weight)) for m in (1, 5)]
    assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True))
    assert not torch.equal(int8_x, off[1])  # the int4 format's groups did take int8 x


@native
def test_thread_count_does_not_change_results() -> None:
    packed = pack(_random_codes_weight(16 * 37 + 3, 1536, 64))
    x = torch.randn(5, 1536).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = matmul(x, packed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, matmul(x, packed))


@native
def test_chunked_packing_matches_a_single_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _random_codes_weight(100, 128, 64)
    whole = pack(weight)
    monkeypatch.setattr(int4_native, "_PACK_ROW_CHUNK", 32)
    chunked = pack(weight)
    for a, b in zip(
        (whole.qweight, whole.scales, whole.row_scale),
        (chunked.qweight, chunked.scales, chunked.row_scale),
        strict=True,
    ):
        assert torch.equal(a, b)


@native
def test_argument_errors() -> None:
    packed = pack(_weight(20, 128))
    with pytest.raises(ValueError, match="128"):
        matmul(torch.randn(2, 64, dtype=torch.bfloat16), packed)
    with pytest.raises(ValueError, match="bf16 / fp32"):
        matmul(torch.randn(2, 128, dtype=torch.float16), packed)
    with pytest.raises(ValueError, match="128"):
        matmul(torch.tensor(1.0, dtype=torch.bfloat16), packed)


@pytest.mark.skipif(not int4_native.available(), reason="native int4 kernel unavailable here")
def test_compiles_with_torch_compile() -> None:
    """The op has a fake (shape) implementation, so torch.compile traces through it."""
    torch.manual_seed(0)
    packed = int4_native.pack(quantize_int4(torch.randn(40, 128), 32))
    x = torch.randn(3, 128).to(torch.bfloat16)
    compiled = torch.compile(lambda t: int4_native.matmul(t, packed) * 2, dynamic=False)
    assert torch.equal(compiled(x), int4_native.matmul(x, packed) * 2)
