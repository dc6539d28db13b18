"""Int8-group weights: the weight's checks and dequantisation, the native kernel's layout,
accuracy against a float64 reference, bit-exact batch invariance, and ``Int8GroupLinear``
(native against the dequantised fallback, the ``SPECSERVE_INT8_NATIVE=0`` switch)."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from specserve.models.native import build, int4_native, int8_native
from specserve.models.native.int8_native import Int8Packed, matmul, pack
from specserve.models.quant.int8_group import Int8GroupLinear, Int8GroupWeight

native = pytest.mark.skipif(
    not int8_native.available(),
    reason=f"native int8-group kernel: {int8_native.unavailable_reason()}",
)


def _weight(n: int, k: int, gs: int, seed: int = 0, kind: str = "signed") -> Int8GroupWeight:
    """Random codes with positive scales. ``signed``: codes in -128..127, small offsets (like
    8-bit blocks); ``shifted``: codes in 0..63, offset -32·scale + noise (like 6-bit blocks
    with a per-group minimum)."""
    gen = torch.Generator().manual_seed(seed)
    groups = k // gs
    scale = torch.rand(n, groups, generator=gen) * 0.01 + 1e-3
    if kind == "signed":
        codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
        offset = torch.randn(n, groups, generator=gen) * 1e-3
    else:
        codes = torch.randint(0, 64, (n, k), dtype=torch.int8, generator=gen)
        offset = -32 * scale + torch.randn(n, groups, generator=gen) * 1e-3
    return Int8GroupWeight(codes, scale, offset, gs)


def _reference(x: torch.Tensor, weight: Int8GroupWeight) -> torch.Tensor:
    return x.double() @ weight.dequantize(torch.float64).T


def _check_close(y: torch.Tensor, ref: torch.Tensor) -> None:
    """Within bf16 rounding of the output: compare with rounding the exact result to bf16."""
    err = (y.double() - ref).norm() / ref.norm()
    if y.dtype == torch.float32:  # only the fp16 scales' rounding and fp32 sums
        assert err < 1e-3, float(err)
        return
    rounding = (ref.to(torch.bfloat16).double() - ref).norm() / ref.norm()
    assert err <= 2.0 * rounding + 1e-4, (float(err), float(rounding))
    worst = (y.double() - ref).abs().max() / ref.abs().max()
    assert worst < 2e-2, float(worst)


# ---------------------------------------------------------------- the weight ----------------


def test_weight_dequantizes_per_group() -> None:
    codes = torch.tensor([[1, -2, 3, 4], [0, 127, -128, 5]], dtype=torch.int8)
    scale = torch.tensor([[0.5, 2.0], [1.0, 0.25]])
    offset = torch.tensor([[1.0, -1.0], [0.0, 3.0]])
    w = Int8GroupWeight(codes, scale, offset, 2)
    expected = torch.tensor([[1.5, 0.0, 5.0, 7.0], [0.0, 127.0, -29.0, 4.25]])
    assert torch.equal(w.dequantize(), expected)
    assert w.dequantize(torch.bfloat16).dtype == torch.bfloat16
    assert (w.out_features, w.in_features) == (2, 4)


@pytest.mark.parametrize(
    ("codes", "scale", "offset", "gs", "match"),
    [
        (torch.zeros(4, 8, dtype=torch.uint8), torch.ones(4, 2), torch.ones(4, 2), 4, "int8"),
        (torch.zeros(8, dtype=torch.int8), torch.ones(4, 2), torch.ones(4, 2), 4, r"\[N, K\]"),
        (torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 2), torch.ones(4, 2), 3, "divide"),
        (torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 2), torch.ones(4, 2), 0, "divide"),
        (torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 4), torch.ones(4, 2), 4, "scale"),
        (
            torch.zeros(4, 8, dtype=torch.int8),
            torch.ones(4, 2),
            torch.ones(4, 2, dtype=torch.float16),
            4,
            "offset must be fp32",
        ),
    ],
)
def test_weight_checks_shapes_and_dtypes(
    codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, gs: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        Int8GroupWeight(codes, scale, offset, gs)


# ---------------------------------------------------------------- layout (no kernel) --------


@pytest.mark.parametrize("inline", [True, False])
def test_pack_layout_and_padding(inline: bool) -> None:
    n, k, gs = 21, 32, 16
    weight = _weight(n, k, gs, kind="shifted")
    packed = pack(weight, inline_constants=inline)
    assert packed.inline_constants is inline
    if inline:  # the same codes and constants as the layout with the constants apart
        assert packed.qweight.shape == (2, k // 4 + k // gs, 64) and packed.scales.numel() == 0
        split = pack(weight, inline_constants=False)
        assert torch.equal(packed.code_blocks(), split.qweight)
        assert torch.equal(packed.constants(), split.scales)
    else:
        assert packed.qweight.shape == (2, k // 4, 64)
        assert packed.scales.shape == (2, k // gs, 2, 16)
    assert packed.qweight.dtype == torch.int8 and packed.scales.dtype == torch.float16
    assert packed.row_scale.shape == (32,) and packed.out_features == n
    assert packed.in_features == k and packed.group_size == gs
    # Byte h*32 + c*8 + r of block B of tile T is code[16T + 8h + r, 4B + c].
    q = packed.code_blocks().view(2, k // 4, 2, 4, 8)  # [T, B, h, c, r]
    codes = q.permute(0, 2, 4, 1, 3).reshape(32, k)
    assert torch.equal(codes[:n], weight.codes)
    assert not codes[n:].any()  # padding rows are zero
    scale = packed.constants()[:, :, 0].permute(0, 2, 1).reshape(32, -1).float()
    offset = packed.constants()[:, :, 1].permute(0, 2, 1).reshape(32, -1).float()
    rs = packed.row_scale[:, None]
    torch.testing.assert_close(scale[:n] * rs[:n], weight.scale, rtol=1e-3, atol=0)
    assert ((offset[:n] * rs[:n] - weight.offset).abs() <= 1e-3 * rs[:n]).all()
    assert not scale[n:].any() and not offset[n:].any()
    assert torch.equal(packed.row_scale[n:], torch.ones(32 - n))
    peak = torch.maximum(weight.scale.abs().amax(1), weight.offset.abs().amax(1))
    assert (packed.row_scale[:n] >= peak).all() and (packed.row_scale[:n] < 2 * peak).all()
    exp = torch.frexp(packed.row_scale).exponent
    assert torch.equal(packed.row_scale, torch.ldexp(torch.ones(32), exp - 1))  # powers of two


def test_pack_rejects_unsupported_group_size() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        pack(_weight(16, 60, gs=6))


@pytest.mark.parametrize("inline", [True, False])
def test_packed_validates_its_tensors(inline: bool) -> None:
    packed = pack(_weight(20, 64, 16), inline_constants=inline)
    with pytest.raises(ValueError, match="out_features"):
        Int8Packed(packed.qweight, packed.scales, packed.row_scale, 40, 16)
    with pytest.raises(ValueError, match="scales"):
        Int8Packed(packed.qweight, packed.scales.float(), packed.row_scale, 20, 16)
    with pytest.raises(ValueError, match="qweight"):
        Int8Packed(packed.qweight.view(torch.uint8), packed.scales, packed.row_scale, 20, 16)
    with pytest.raises(ValueError, match="group_size"):
        Int8Packed(packed.qweight, packed.scales, packed.row_scale, 20, 6)


def test_chunked_packing_matches_a_single_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _weight(100, 64, 16)
    whole = pack(weight)
    monkeypatch.setattr(int8_native, "_PACK_ROW_CHUNK", 32)
    chunked = pack(weight)
    for a, b in zip(
        (whole.qweight, whole.scales, whole.row_scale),
        (chunked.qweight, chunked.scales, chunked.row_scale),
        strict=True,
    ):
        assert torch.equal(a, b)


def test_env_switch_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_INT8_NATIVE", "0")
    monkeypatch.setattr(int8_native._kernel, "state", {})  # as in a fresh process
    assert not int8_native.available()
    assert "SPECSERVE_INT8_NATIVE" in (int8_native.unavailable_reason() or "")
    assert int8_native._kernel.state == {}  # nothing was built or loaded
    with pytest.raises(RuntimeError, match="not loaded"):
        matmul(torch.randn(1, 64, dtype=torch.bfloat16), pack(_weight(16, 64, 16)))


def test_failed_build_reports_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(int8_native._kernel, "state", {})
    monkeypatch.setattr(int8_native, "_load", lambda: "build failed: no compiler")
    with caplog.at_level(logging.WARNING, logger=int8_native.__name__):
        assert not int8_native.available()
        assert not int8_native.available()
    assert int8_native.unavailable_reason() == "build failed: no compiler"
    assert sum("no compiler" in r.getMessage() for r in caplog.records) == 1  # logged once


@pytest.mark.skipif(
    not {"avx2", "fma", "f16c"} <= build.cpu_signature()[1],
    reason="a CPU without AVX2 / FMA / F16C",
)
def test_the_kernels_pass_their_self_tests_where_the_cpu_has_them() -> None:
    """A kernel whose self-test fails is refused and its tests skip; on a CPU with the
    instructions that is a failure here (the six-bit superblock self-test runs the layout this
    host packs: the quad order on AVX2 hosts)."""
    assert int8_native.available(), int8_native.unavailable_reason()
    assert int4_native.available(), int4_native.unavailable_reason()


# ---------------------------------------------------------------- kernel --------------------


@native
@pytest.mark.parametrize(
    ("n", "k", "gs", "kind"),
    [
        (1007, 896, 16, "signed"),
        (37, 1536, 32, "shifted"),
        (64, 256, 16, "shifted"),
        (24, 8960, 16, "signed"),
        (5, 96, 32, "signed"),
        (19, 64, 4, "shifted"),
    ],
)
def test_matches_float64_reference(n: int, k: int, gs: int, kind: str) -> None:
    weight = _weight(n, k, gs, kind=kind)
    packed = pack(weight)
    split = pack(weight, inline_constants=False)
    gen = torch.Generator().manual_seed(1)
    for m in (*range(1, 18), 40):
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        y = matmul(x, packed)
        assert torch.equal(y, matmul(x, split)), m  # the two layouts: the same arithmetic
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        ref = _reference(x, weight)
        _check_close(y, ref)
        y32 = matmul(x.float(), packed)  # fp32 out: the same sums, not rounded to bf16
        assert y32.dtype == torch.float32
        _check_close(y32, ref)
        assert torch.equal(y, y32.to(torch.bfloat16))  # bf16 out: rounded to nearest even


@native
def test_fp32_input_is_rounded_to_bf16_first() -> None:
    weight = _weight(40, 256, 16)
    packed = pack(weight)
    x = torch.randn(3, 256)
    y = matmul(x, packed)
    assert y.dtype == torch.float32 and y.shape == (3, 40)
    assert torch.equal(y, matmul(x.to(torch.bfloat16).float(), packed))
    _check_close(y, _reference(x.to(torch.bfloat16), weight))


@native
def test_leading_dims_and_empty_batch() -> None:
    packed = pack(_weight(20, 128, 16))
    x = torch.randn(2, 3, 128, dtype=torch.bfloat16)
    y = matmul(x, packed)
    assert y.shape == (2, 3, 20)
    assert torch.equal(y.view(6, 20), matmul(x.view(6, 128), packed))
    assert matmul(torch.empty(0, 128, dtype=torch.bfloat16), packed).shape == (0, 20)


@native
def test_large_magnitude_weights_keep_their_precision() -> None:
    """The per-row power-of-two row_scale keeps fp16 scales in range."""
    weight = _weight(32, 128, 16, kind="shifted")
    x = torch.randn(2, 128).to(torch.bfloat16)
    for factor in (1e6, 1e-9):
        w = Int8GroupWeight(weight.codes, weight.scale * factor, weight.offset * factor, 16)
        _check_close(matmul(x, pack(w)), _reference(x, w))


@native
@pytest.mark.parametrize(("n", "k", "gs"), [(1000 + 7, 1536, 16), (53, 896, 32), (40, 512, 4)])
def test_batch_invariance_is_bit_exact(n: int, k: int, gs: int) -> None:
    """Each row of an M-row call equals the 1-row call of that row, whatever M and the other
    rows are."""
    packed = pack(_weight(n, k, gs))
    gen = torch.Generator().manual_seed(2)
    probe = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    single = matmul(probe, packed)
    for m in range(1, 17):
        x = (torch.randn(m, k, generator=gen) * 10).to(torch.bfloat16)
        y = matmul(x, packed)
        for i in range(m):  # every row against its own 1-row call
            assert torch.equal(y[i : i + 1], matmul(x[i : i + 1], packed)), (m, i)
        for pos in {0, m // 2, m - 1}:  # one row among different neighbours
            x[pos] = probe[0]
            assert torch.equal(matmul(x, packed)[pos : pos + 1], single), (m, pos)


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return any(flag in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


@native
@pytest.mark.skipif(not _cpu_has("avx512f"), reason="the 16-lane variant needs AVX-512F")
def test_sixteen_and_eight_lane_kernels_agree_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The AVX-512F kernels run the 8-lane (AVX2) arithmetic 16 lanes a vector: same bits,
    for every M (1- and 2-row paths, register blocks of 3 - 8 rows, several blocks) and a
    ragged last tile."""
    gen = torch.Generator().manual_seed(4)
    for (n, k, gs), inline in itertools.product(
        ((16 * 21 + 5, 1536, 16), (37, 896, 32), (19, 64, 4)), (True, False)
    ):
        packed = pack(_weight(n, k, gs), inline_constants=inline)
        for m in (1, 2, 3, 4, 5, 7, 8, 9, 13, 17, 40):
            x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16)
            monkeypatch.setenv("SPECSERVE_INT8_AVX512", "1")
            wide, wide32 = matmul(x, packed), matmul(x.float(), packed)
            monkeypatch.setenv("SPECSERVE_INT8_AVX512", "0")
            narrow, narrow32 = matmul(x, packed), matmul(x.float(), packed)
            assert torch.equal(wide, narrow) and torch.equal(wide32, narrow32), (n, k, m)


@native
@pytest.mark.parametrize(
    "switch", ["SPECSERVE_SWEEP_PREFETCH", "SPECSERVE_ONE_TILE_PREFETCH", "SPECSERVE_PREFETCH_L2"]
)
def test_prefetch_switches_change_no_bit(monkeypatch: pytest.MonkeyPatch, switch: str) -> None:
    """Where the kernels prefetch moves reads only, in the 16- and the 8-lane kernels and both
    layouts: the sweep of the two-tile (2-row) path, on or off, and the distance of the
    one-tile runs (4 or more rows, the last tiles), far or as the others', and the cache
    level the lines go to (L2 or L1), give the same bits on every path and a ragged last
    tile."""
    gen = torch.Generator().manual_seed(6)
    for lanes, inline in itertools.product(("1", "0"), (True, False)):
        packed = pack(_weight(16 * 21 + 5, 1536, 16, seed=7), inline_constants=inline)
        monkeypatch.setenv("SPECSERVE_INT8_AVX512", lanes)
        for m in (1, 2, 3, 4, 5, 9):
            x = (torch.randn(m, 1536, generator=gen) * 3).to(torch.bfloat16)
            monkeypatch.setenv(switch, "1")
            on = matmul(x, packed)
            monkeypatch.setenv(switch, "0")
            assert torch.equal(on, matmul(x, packed)), (lanes, inline, m)


@native
@pytest.mark.parametrize("shift", [0, 2])  # byte codes; codes in -32..31 (packed in six bits)
def test_thread_count_does_not_change_results(shift: int) -> None:
    w = _weight(16 * 37 + 3, 1536, 16)
    bits = 6 if shift else 8
    packed = pack(Int8GroupWeight(w.codes >> shift, w.scale, w.offset, 16), code_bits=bits)
    x = torch.randn(5, 1536).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = matmul(x, packed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, matmul(x, packed))


@native
def test_argument_errors() -> None:
    packed = pack(_weight(20, 128, 16))
    with pytest.raises(ValueError, match="128"):
        matmul(torch.randn(2, 64, dtype=torch.bfloat16), packed)
    with pytest.raises(ValueError, match="bf16 / fp32"):
        matmul(torch.randn(2, 128, dtype=torch.float16), packed)
    with pytest.raises(RuntimeError, match="int8"):  # the op checks the layout itself
        torch.ops.specserve.int8_gemm(
            torch.randn(2, 128, dtype=torch.bfloat16),
            packed.qweight.view(torch.uint8),
            packed.scales,
            packed.row_scale,
            20,
            16,
        )


@native
def test_compiles_with_torch_compile() -> None:
    """The op has a fake (shape) implementation, so torch.compile traces through it."""
    packed = pack(_weight(40, 128, 16))
    x = torch.randn(3, 128).to(torch.bfloat16)
    compiled = torch.compile(lambda t: matmul(t, packed) * 2, dynamic=False)
    assert torch.equal(compiled(x), matmul(x, packed) * 2)


# ---------------------------------------------------------------- Int8GroupLinear -----------


@native
def test_linear_native_agrees_with_the_dequantised_fallback() -> None:
    weight = _weight(50, 256, 16, kind="shifted")
    bias = torch.randn(50)
    fast = Int8GroupLinear(weight, bias, torch.bfloat16)
    slow = Int8GroupLinear(weight, bias, torch.bfloat16, native=False)
    assert fast.native is not None and slow.native is None
    assert fast.qweight is fast.native.qweight and fast.row_scale is fast.native.row_scale
    assert "kernel=native" in fast.extra_repr() and "kernel=dequant" in slow.extra_repr()
    x = torch.randn(2, 3, 256).to(torch.bfloat16)
    y_fast, y_slow = fast(x), slow(x)
    assert y_fast.shape == y_slow.shape == (2, 3, 50) and y_fast.dtype == torch.bfloat16
    ref = _reference(x.view(6, 256), weight) + bias.to(torch.bfloat16).double()
    for y in (y_fast, y_slow):
        err = float((y.view(6, 50).double() - ref).norm() / ref.norm())
        assert err < 1e-2, err
    assert set(dict(fast.named_buffers())) == {"bias", "qweight", "scales_and_zeros", "row_scale"}


def test_linear_fallback_for_fp32_and_without_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _weight(24, 64, 16)
    fp32 = Int8GroupLinear(weight, None, torch.float32)  # the kernel would round x to bf16
    assert fp32.native is None and fp32.weight.dtype == torch.float32
    x = torch.randn(4, 64)
    torch.testing.assert_close(fp32(x), x @ weight.dequantize().T)
    monkeypatch.setenv("SPECSERVE_INT8_NATIVE", "0")
    off = Int8GroupLinear(weight, None, torch.bfloat16)
    assert off.native is None and set(dict(off.named_buffers())) == {"weight"}
    with pytest.raises(RuntimeError, match="SPECSERVE_INT8_NATIVE"):
        Int8GroupLinear(weight, None, torch.bfloat16, native=True)


def test_linear_keeps_unpackable_group_sizes_on_the_fallback() -> None:
    weight = _weight(16, 60, 6)
    layer = Int8GroupLinear(weight, None, torch.bfloat16)
    assert layer.native is None and layer.group_size == 6
    x = torch.randn(2, 60).to(torch.bfloat16)
    torch.testing.assert_close(
        layer(x).float(),
        (x.float() @ weight.dequantize(torch.bfloat16).float().T),
        rtol=2e-2,
        atol=2e-2,
    )
