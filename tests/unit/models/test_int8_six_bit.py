"""Six-bit codes in the int8-group kernel's tile stream: the packing (three blocks for the 256
codes of 16 rows and 16 inputs, unpacked to the byte layout's blocks), when :func:`pack`
chooses it, the checks of a six-bit packed weight, and the kernels: the fp32 ones bit-identical
to the same weight packed with byte codes, the bf16-pair one (AVX-512 BF16 hosts) equal to them
up to fp32 rounding; on every path (1- to 40-row calls, both vector widths, prefetch switches,
thread split) rows batch invariant and close to a float64 reference."""

from __future__ import annotations

import itertools

import pytest
import torch

from specserve.models.native import build, int8_native, six_bit
from specserve.models.native.int8_native import Int8Packed, matmul, pack
from specserve.models.quant.int8_group import Int8GroupLinear, Int8GroupWeight

native = pytest.mark.skipif(
    not int8_native.available(),
    reason=f"native int8-group kernel: {int8_native.unavailable_reason()}",
)


def _weight(
    n: int, k: int, gs: int, seed: int = 0, low: int = -32, high: int = 32
) -> Int8GroupWeight:
    """Codes in [low, high) with positive scales and small offsets (Q6_K's codes q - 32 lie in
    -32 .. 31; Q5_K's and Q4_K's in 0 .. 31 and 0 .. 15, with their minimum as the offset)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(low, high, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, k // gs, generator=gen) * 0.01 + 1e-3
    offset = torch.randn(n, k // gs, generator=gen) * 1e-2
    return Int8GroupWeight(codes, scale, offset, gs)


@pytest.fixture(autouse=True)
def six_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`pack` takes six bits wherever they fit, whatever this CPU prefers (the tests
    below are about six-bit codes; the default's choice has its own test)."""
    monkeypatch.setenv("SPECSERVE_SIX_BIT_CODES", "1")


# ---------------------------------------------------------------- layout (no kernel) --------


@pytest.mark.parametrize(("n", "k", "gs"), [(21, 32, 16), (40, 96, 32), (16, 64, 64)])
def test_six_bit_packing_holds_the_byte_layouts_codes(n: int, k: int, gs: int) -> None:
    weight = _weight(n, k, gs)
    six, byte = pack(weight), pack(weight, code_bits=8)
    assert (six.code_bits, byte.code_bits) == (6, 8)
    tiles = -(-n // 16)
    assert six.qweight.shape == (tiles, k // gs, 3 * gs // 16 + 1, 64)
    assert six.qweight.dtype == torch.int8 and six.scales.numel() == 0
    assert six.inline_constants and (six.in_features, six.out_features) == (k, n)
    assert torch.equal(six.code_blocks(), byte.code_blocks())  # padding rows included
    assert torch.equal(six.constants(), byte.constants())
    assert torch.equal(six.row_scale, byte.row_scale)
    # three bytes for four codes, the same constants and row scales
    constants = tiles * (k // gs) * 64 + tiles * 16 * 4
    assert six.nbytes() - constants == (byte.nbytes() - constants) * 3 // 4


def test_unit_bytes_follow_the_documented_formula() -> None:
    """L0, L1 and H of a unit from u_b[16 c + i] = code[i, 4 b + c] + 32 (the docstring)."""
    weight = _weight(16, 16, 16, seed=3)
    unit = pack(weight).qweight[0, 0, :3].view(torch.uint8).long()  # [3, 64]
    u = (weight.codes.long() + 32).view(16, 4, 4).permute(1, 2, 0).reshape(4, 64)  # [b, 16c + i]
    assert torch.equal(unit[0], (u[0] & 15) | ((u[1] & 15) << 4))
    assert torch.equal(unit[1], (u[2] & 15) | ((u[3] & 15) << 4))
    assert torch.equal(
        unit[2], (u[0] >> 4) | ((u[1] >> 4) << 2) | ((u[2] >> 4) << 4) | ((u[3] >> 4) << 6)
    )


@pytest.mark.parametrize(
    ("low", "high", "gs", "inline", "bits"),
    [
        (-32, 32, 16, True, 6),  # Q6_K's codes
        (0, 32, 32, True, 6),  # Q5_K's
        (0, 16, 16, True, 6),  # Q4_K's (a fused projection's int8 parts)
        (-33, 32, 16, True, 8),  # one code below -32
        (0, 64, 16, True, 8),  # up to 63
        (-128, 128, 32, True, 8),  # Q8_0's
        (-32, 32, 8, True, 8),  # groups of 8: no whole units
        (-32, 32, 16, False, 8),  # constants apart: byte codes only
    ],
)
def test_pack_takes_six_bits_wherever_they_fit(
    low: int, high: int, gs: int, inline: bool, bits: int
) -> None:
    weight = _weight(32, 64, gs, low=low, high=high)
    if low == -33:  # one code just out of range
        weight.codes[3, 5] = -33
    assert pack(weight, inline_constants=inline).code_bits == bits


def test_pack_stores_six_bits_by_default_only_where_they_run_as_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unset, the switch leaves the choice to the CPU: six bits where the bf16-pair kernel
    reads them (dot products), else bytes, which the fp32 kernels read faster. 1 / 0 force
    six bits / bytes; an explicit ``code_bits`` wins over both."""
    weight = _weight(32, 64, 16)
    monkeypatch.delenv("SPECSERVE_SIX_BIT_CODES")
    assert six_bit.preferred() == six_bit.dot_products()
    assert pack(weight).code_bits == (6 if six_bit.dot_products() else 8)
    for dot, bits in ((True, 6), (False, 8)):
        monkeypatch.setattr(six_bit, "dot_products", lambda dot=dot: dot)
        assert pack(weight).code_bits == bits
    for forced, bits in (("1", 6), ("0", 8)):
        monkeypatch.setenv("SPECSERVE_SIX_BIT_CODES", forced)
        assert six_bit.preferred() == (bits == 6)
        assert pack(weight).code_bits == bits
        assert pack(weight, code_bits=6).code_bits == 6
        assert pack(weight, code_bits=8).code_bits == 8
    monkeypatch.setenv("SPECSERVE_SIX_BIT_CODES", "1")
    assert pack(_weight(32, 64, 16, low=-40)).code_bits == 8  # forced only where they fit


@pytest.mark.parametrize(
    ("gs", "inline", "low", "high", "match"),
    [
        (8, True, -32, 32, "multiple of 16"),
        (16, False, -32, 32, "inline"),
        (16, True, -40, 32, "-32 .. 31"),
        (16, True, 0, 64, "-32 .. 31"),
    ],
)
def test_forced_six_bits_refuse_what_does_not_fit(
    gs: int, inline: bool, low: int, high: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        pack(_weight(16, 64, gs, low=low, high=high), inline_constants=inline, code_bits=6)
    with pytest.raises(ValueError, match="code_bits"):
        pack(_weight(16, 64, 16), code_bits=4)


def test_six_bit_packed_weight_validates_its_tensors() -> None:
    p = pack(_weight(20, 64, 16))
    assert p.code_bits == 6
    with pytest.raises(ValueError, match="out_features"):
        Int8Packed(p.qweight, p.scales, p.row_scale, 40, 16)
    with pytest.raises(ValueError, match="inline"):
        Int8Packed(p.qweight, torch.zeros(2, 4, 2, 16, dtype=torch.float16), p.row_scale, 20, 16)
    with pytest.raises(ValueError, match=r"\[Np/16, K/G, 7, 64\]"):  # blocks for groups of 32
        Int8Packed(p.qweight, p.scales, p.row_scale, 20, 32)
    with pytest.raises(ValueError, match="multiple of 16"):
        Int8Packed(p.qweight, p.scales, p.row_scale, 20, 8)
    with pytest.raises(ValueError, match="int8"):
        Int8Packed(p.qweight.view(torch.uint8), p.scales, p.row_scale, 20, 16)
    with pytest.raises(ValueError, match="row_scale"):
        Int8Packed(p.qweight, p.scales, p.row_scale[:16], 20, 16)


def test_chunked_six_bit_packing_matches_a_single_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _weight(100, 64, 16)
    whole = pack(weight)
    monkeypatch.setattr(int8_native, "_PACK_ROW_CHUNK", 32)
    chunked = pack(weight)
    assert whole.code_bits == chunked.code_bits == 6
    assert torch.equal(whole.qweight, chunked.qweight)
    assert torch.equal(whole.row_scale, chunked.row_scale)


# ---------------------------------------------------------------- kernel --------------------


_, _FLAGS = build.cpu_signature()


_LANES = ("1", "0") if "avx512f" in _FLAGS else ("0",)


def test_dot_products_follow_the_cpu_and_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    flags = ("avx512bw", "avx512vbmi", "avx512_bf16", "gfni")
    monkeypatch.delenv("SPECSERVE_INT8_AVX512", raising=False)
    assert six_bit.dot_products() == all(f in _FLAGS for f in flags)
    monkeypatch.setenv("SPECSERVE_INT8_AVX512", "0")
    assert not six_bit.dot_products()


@native
@pytest.mark.parametrize(
    ("n", "k", "gs", "low", "high"),
    [
        (16 * 21 + 5, 1536, 16, -32, 32),
        (37, 896, 32, 0, 32),
        (24, 8960, 16, -32, 32),
        (19, 64, 64, 0, 16),
    ],
)
def test_six_bit_codes_give_the_byte_codes_bits(
    monkeypatch: pytest.MonkeyPatch, n: int, k: int, gs: int, low: int, high: int
) -> None:
    """Every path (1-, 2- and 3-row kernels, register blocks of 4 - 8 rows, several blocks, a
    ragged last tile), bf16 and fp32 outputs, 16- and 8-lane variants: the same bits as byte
    codes, or where six-bit codes run as bf16 pairs the same values up to fp32 rounding."""
    weight = _weight(n, k, gs, low=low, high=high)
    six, byte = pack(weight), pack(weight, code_bits=8)
    assert six.code_bits == 6
    gen = torch.Generator().manual_seed(1)
    ref_w = weight.dequantize(torch.float64)
    for lanes in _LANES:
        monkeypatch.setenv("SPECSERVE_INT8_AVX512", lanes)
        dot = six_bit.dot_products()
        for m in (1, 2, 3, 4, 5, 7, 8, 9, 13, 17, 40):
            x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16)
            y, y32 = matmul(x, six), matmul(x.float(), six)
            y_byte, y32_byte = matmul(x, byte), matmul(x.float(), byte)
            if dot:  # other sums: fp32 rounding apart, bf16 outputs within one rounding
                assert float((y32 - y32_byte).norm() / y32_byte.norm()) < 1e-5, m
                assert ((y.float() - y_byte.float()).abs() <= y_byte.float().abs() / 64).all()
            else:
                assert torch.equal(y, y_byte), (lanes, m)
                assert torch.equal(y32, y32_byte), (lanes, m)
            assert torch.equal(y, y32.to(torch.bfloat16))  # bf16 out: rounded to nearest even
            ref = x.double() @ ref_w.T
            assert float((y.double() - ref).norm() / ref.norm()) < 1e-2


@native
@pytest.mark.parametrize("switch", ["SPECSERVE_SWEEP_PREFETCH", "SPECSERVE_ONE_TILE_PREFETCH"])
def test_six_bit_rows_are_batch_invariant_whatever_the_prefetch(
    monkeypatch: pytest.MonkeyPatch, switch: str
) -> None:
    packed = pack(_weight(16 * 13 + 7, 1536, 16, seed=5))
    gen = torch.Generator().manual_seed(2)
    for lanes, on in itertools.product(_LANES, ("1", "0")):
        monkeypatch.setenv("SPECSERVE_INT8_AVX512", lanes)
        monkeypatch.setenv(switch, on)
        for m in (2, 3, 5, 9):
            x = (torch.randn(m, 1536, generator=gen) * 10).to(torch.bfloat16)
            y = matmul(x, packed)
            for i in range(m):
                assert torch.equal(y[i : i + 1], matmul(x[i : i + 1], packed)), (lanes, on, m, i)


@native
def test_op_checks_the_six_bit_layout() -> None:
    p = pack(_weight(20, 128, 16))
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="six-bit qweight"):  # blocks for groups of 32
        torch.ops.specserve.int8_gemm(x, p.qweight, p.scales, p.row_scale, 20, 32)
    with pytest.raises(RuntimeError, match="inline"):
        scales = torch.zeros(2, 8, 2, 16, dtype=torch.float16)
        torch.ops.specserve.int8_gemm(x, p.qweight, scales, p.row_scale, 20, 16)


@native
def test_linear_packs_six_bit_codes_and_keeps_its_outputs() -> None:
    weight = _weight(50, 256, 16)
    bias = torch.randn(50)
    fast = Int8GroupLinear(weight, bias, torch.bfloat16)
    slow = Int8GroupLinear(weight, bias, torch.bfloat16, native=False)
    assert fast.native is not None and fast.native.code_bits == 6
    assert fast.qweight is fast.native.qweight
    x = torch.randn(3, 256).to(torch.bfloat16)
    ref = x.double() @ weight.dequantize(torch.float64).T + bias.to(torch.bfloat16).double()
    for y in (fast(x), slow(x)):
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
