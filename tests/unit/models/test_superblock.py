"""Six-bit codes with superblock constants (models/native/superblock.py): the factoring of
per-group constants into an fp32 superblock scale times int8 codes (exact, or refused), the
packed layout and its inverse, when :func:`int8_native.pack` writes it, the checks of such a
weight, and the kernel that reads it (AVX-512 BF16 / VBMI / GFNI hosts): close to a float64
reference, exact constants (fp32 outputs within fp32 rounding), rows batch invariant, and the
real Q6_K tensors of the default GGUF file; and the kernels on int8 activations (the same
kernel on AVX-512 VNNI builds, the quad-order kernel on AVX2 hosts): their own float64
reference, batch invariance, the switch, non-finite groups."""

from __future__ import annotations

import pytest
import torch

from specserve.models.native import int8_native, superblock
from specserve.models.native.int8_native import Int8Packed, matmul, pack
from specserve.models.quant.int8_group import Int8GroupWeight
from tests.kernel_checks import (
    assert_exact_and_batch_invariant,
    assert_int8_activation_edges,
    assert_int8_activations_switch_off,
    int8_activation_product,
)

kernel = pytest.mark.skipif(
    not (int8_native.available() and superblock.preferred() and not superblock.quad_order()),
    reason="superblock constants on bf16 activations: the AVX-512 BF16 / VBMI / GFNI kernel only",
)


def k_quant(
    n: int, k: int, seed: int = 0, offsets: bool = False, sign: int = 1, span: int = 0
) -> Int8GroupWeight:
    """Codes in -32 .. 31 in groups of 16 with K-quant constants: per row and ``span`` inputs
    (default 256, or 64 where K is no multiple of 256) an fp16 ``d`` (negative with ``sign``
    -1) times int8 scale codes, and with ``offsets`` an fp16 ``dmin`` times minimum codes
    0 .. 63 (Q4_K's ``−dmin·m``)."""
    gen = torch.Generator().manual_seed(seed)
    span = span or (256 if k % 256 == 0 else 64)
    codes = torch.randint(-32, 32, (n, k), dtype=torch.int8, generator=gen)
    d = (sign * (torch.rand(n, k // span, generator=gen) * 1e-3 + 1e-4)).half().float()
    sc = torch.randint(-128, 128, (n, k // 16), generator=gen).float()
    scale = d.repeat_interleave(span // 16, dim=1) * sc
    offset = torch.zeros_like(scale)
    if offsets:
        dmin = (torch.rand(n, k // span, generator=gen) * 1e-3).half().float()
        m = torch.randint(0, 64, (n, k // 16), generator=gen).float()
        offset = -(dmin.repeat_interleave(span // 16, dim=1) * m)
    return Int8GroupWeight(codes, scale, offset, 16)


# ---------------------------------------------------------------- factoring ------------------


@pytest.mark.parametrize("sign", [1, -1])
def test_factor_recovers_the_k_quant_form_exactly(sign: int) -> None:
    w = k_quant(40, 512, sign=sign)
    factored = superblock.factor(w.scale, 16)
    assert factored is not None
    d, codes = factored
    assert d.shape == (40, 2) and codes.dtype == torch.int8 and codes.shape == (40, 32)
    back = d.repeat_interleave(16, dim=1) * codes.float()
    assert torch.equal(back, w.scale)


def test_factor_takes_the_sign_that_keeps_minus_128() -> None:
    """A negative d times a code -128 is +128 times -d: the codes stay in int8 either way."""
    d = torch.tensor([[-0.5]])
    values = d * torch.tensor([[-128.0, 3.0, 0.0, 5.0]])
    factored = superblock.factor(values, 4)
    assert factored is not None
    assert torch.equal(factored[0] * factored[1].float(), values)
    assert int(factored[1].min()) >= -128 and int(factored[1].max()) <= 127


def test_factor_handles_zero_superblocks() -> None:
    values = torch.zeros(3, 8)
    factored = superblock.factor(values, 4)
    assert factored is not None and not factored[1].any()
    assert factored[0].shape == (3, 2)
    assert torch.equal(factored[0].repeat_interleave(4, dim=1) * factored[1].float(), values)


@pytest.mark.parametrize(
    "values",
    [
        torch.tensor([[1.0, 1000.0, 3.0, 7.0]]),  # codes beyond int8 after the gcd
        torch.tensor([[0.1, 0.7, 0.3, 1e-3]]),  # no common factor with small codes
        torch.tensor([[1.0, float("nan"), 2.0, 3.0]]),
        torch.tensor([[1.0, 2.0**-60, 2.0, 3.0]]),  # exponents too far apart
    ],
)
def test_factor_refuses_constants_without_the_form(values: torch.Tensor) -> None:
    assert superblock.factor(values, 4) is None


def test_factor_rejects_a_partial_superblock() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        superblock.factor(torch.ones(2, 6), 4)


# ---------------------------------------------------------------- layout (no kernel) --------


@pytest.mark.parametrize(("n", "k", "size"), [(40, 512, 256), (21, 192, 64), (16, 512, 128)])
@pytest.mark.parametrize("offsets", [False, True])
def test_pack_and_unpack_round_trip(n: int, k: int, size: int, offsets: bool) -> None:
    w = k_quant(n, k, offsets=offsets, span=size)  # the largest superblock that factors
    packed = superblock.pack(w.codes, w.scale, w.offset)
    assert packed is not None
    qweight, row_scale, chosen = packed
    assert chosen == size
    head = superblock.header_blocks(size, offsets)
    assert qweight.shape == (-(-n // 16), k // size, head + 3 * size // 16, 64)
    assert torch.equal(row_scale, torch.ones(qweight.shape[0] * 16))
    codes, scale, offset = superblock.unpack(qweight, n, size)
    assert torch.equal(codes, w.codes) and torch.equal(scale, w.scale)
    assert torch.equal(offset, w.offset)


@pytest.mark.parametrize("offsets", [False, True])
def test_quad_order_round_trips_and_puts_a_rows_four_inputs_side_by_side(offsets: bool) -> None:
    w = k_quant(40, 512, offsets=offsets)
    packed = superblock.pack(w.codes, w.scale, w.offset, quads=True)
    plain = superblock.pack(w.codes, w.scale, w.offset)
    assert packed is not None and plain is not None
    qweight = packed[0]
    head = superblock.header_blocks(256, offsets)
    assert qweight.shape == (3, 2, head + 48, 2, 32)
    flat = qweight.reshape(3, 2, head + 48, 64)
    assert torch.equal(flat[:, :, :head], plain[0][:, :, :head])  # the same header blocks
    assert not torch.equal(flat, plain[0])
    codes, scale, offset = superblock.unpack(qweight, 40)
    assert torch.equal(codes, w.codes) and torch.equal(scale, w.scale)
    assert torch.equal(offset, w.offset)
    # tile 0's first unit: L0's low nibbles and H's low two bits are u_0 (inputs 0 .. 3),
    # byte 32 h + 4 r + c holding row 8 h + r, input c
    unit = flat[0, 0, head : head + 3].view(torch.uint8).long()
    u0 = (unit[0] & 15) | ((unit[2] & 3) << 4)
    rows = torch.arange(16)
    expect = w.codes[rows[:, None], torch.arange(4)[None, :]].long() + 32  # [row, c]
    assert torch.equal(u0.view(16, 4), expect)


@pytest.mark.parametrize("offsets", [False, True])
def test_chunked_packing_matches_a_single_chunk(
    monkeypatch: pytest.MonkeyPatch, offsets: bool
) -> None:
    w = k_quant(100, 512, offsets=offsets)
    whole = superblock.pack(w.codes, w.scale, w.offset)
    monkeypatch.setattr(superblock, "_ROW_CHUNK", 32)
    chunked = superblock.pack(w.codes, w.scale, w.offset)
    assert whole is not None and chunked is not None
    assert torch.equal(whole[0], chunked[0]) and whole[2] == chunked[2] == 256
    w.scale[70, 3] = 0.123456  # one chunk without the form: the whole weight has none
    assert superblock.pack(w.codes, w.scale, w.offset) is None


def test_the_layout_takes_fewer_bytes_than_per_group_constants() -> None:
    w = k_quant(64, 1024)
    per_group = pack(w, code_bits=6, superblocks=False)
    packed = pack(w, code_bits=6, superblocks=True)
    assert packed.superblock_form == 1 and per_group.superblock_form == 0
    assert packed.nbytes() < 0.84 * per_group.nbytes()  # 53 blocks a superblock against 64
    assert torch.equal(packed.code_blocks(), per_group.code_blocks())
    with pytest.raises(ValueError, match="no per-group fp16 form"):
        packed.constants()


def test_pack_chooses_superblocks_where_preferred(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_SIX_BIT_CODES", "1")
    w = k_quant(32, 256)
    assert pack(w).superblock_form == (1 if superblock.preferred() else 0)
    assert pack(w).quads == (superblock.preferred() and superblock.quad_order())
    monkeypatch.setenv("SPECSERVE_SUPERBLOCK_CONSTANTS", "0")
    assert not superblock.preferred()
    assert pack(w).superblock_form == 0
    # constants without the form keep per-group constants, asked or not
    w.scale[0, 0] = 0.123456
    assert pack(w, superblocks=None).superblock_form == 0
    with pytest.raises(ValueError, match="no superblock form"):
        pack(w, superblocks=True)
    with pytest.raises(ValueError, match="six-bit codes in groups of 16"):
        pack(w, code_bits=8, superblocks=True)


def test_packed_weight_checks_the_superblock_shapes() -> None:
    packed = pack(k_quant(16, 256, offsets=True), code_bits=6, superblocks=True)
    assert packed.superblock_form == 2 and packed.in_features == 256
    bad = packed.qweight[:, :, 1:].contiguous()
    with pytest.raises(ValueError, match="six-bit qweight"):
        Int8Packed(bad, packed.scales, packed.row_scale, 16, 256)


def test_packed_weight_checks_the_quad_order_shapes() -> None:
    w = k_quant(16, 256)
    qweight, row_scale, size = superblock.pack(w.codes, w.scale, w.offset, quads=True) or ()
    empty = torch.empty(0, dtype=torch.float16)
    packed = Int8Packed(qweight, empty, row_scale, 16, size)
    assert packed.quads and packed.superblock_form == 1 and packed.in_features == 256
    assert torch.equal(packed.code_blocks(), pack(w, code_bits=8).code_blocks())
    for bad in (qweight.reshape(1, 1, 53, 4, 16), qweight[:, :, 1:].contiguous()):
        with pytest.raises(ValueError, match="six-bit qweight"):
            Int8Packed(bad, empty, row_scale, 16, size)
    with pytest.raises(ValueError, match="quad order"):  # per-group constants have no such order
        Int8Packed(qweight, empty, row_scale, 16, 16)


# ---------------------------------------------------------------- the kernel ---------------


@pytest.fixture
def bf16_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vdpbf16ps kernel on bf16 activations, also where int8 ones are the default."""
    monkeypatch.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")


@kernel
@pytest.mark.usefixtures("bf16_activations")
@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize(("n", "k"), [(37, 512), (160, 1536), (21, 192)])
def test_kernel_matches_a_float64_reference_and_is_batch_invariant(
    n: int, k: int, offsets: bool
) -> None:
    w = k_quant(n, k, seed=n, offsets=offsets, sign=-1 if n == 37 else 1)
    packed = pack(w, code_bits=6, superblocks=True)
    assert packed.superblock_form == (2 if offsets else 1)
    assert_exact_and_batch_invariant(matmul, packed, w.dequantize())


x8_kernel = pytest.mark.skipif(
    not (int8_native.available() and superblock.preferred())
    or not torch.ops.specserve.int4_int8_activations(),
    reason="int8 activations need the AVX-512 kernels built with VNNI, or AVX2 (quad order)",
)


@x8_kernel
@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize(("n", "k"), [(37, 512), (160, 1536), (21, 192)])
def test_int8_activations_match_their_float64_reference_and_are_batch_invariant(
    n: int, k: int, offsets: bool
) -> None:
    w = k_quant(n, k, seed=n, offsets=offsets, sign=-1 if n == 37 else 1)
    packed = pack(w, code_bits=6, superblocks=True)
    assert_exact_and_batch_invariant(
        matmul,
        packed,
        w.dequantize(),
        reference=lambda x: int8_activation_product(x, w.dequantize(), w.offset),
    )


@x8_kernel
def test_int8_activations_stay_near_the_exact_product_and_the_switch_turns_them_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = k_quant(64, 1536, seed=3)
    packed = pack(w, code_bits=6, superblocks=True)
    if not packed.quads:
        assert_int8_activations_switch_off(matmul, packed, w.dequantize(), monkeypatch, 2e-2)
        return
    # the quad order is packed for int8 activations and keeps them whatever the switch; the
    # switch off at load packs per-group constants on bf16 activations instead
    x = torch.randn(5, 1536, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    exact = x.double() @ w.dequantize().double().T
    on = matmul(x.float(), packed)
    assert 1e-5 < float((on.double() - exact).norm() / exact.norm()) < 2e-2
    monkeypatch.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")
    assert torch.equal(matmul(x.float(), packed), on)
    assert not superblock.preferred()
    off = pack(w)
    assert off.superblock_form == 0 and off.code_bits == 8
    assert float((matmul(x.float(), off).double() - exact).norm() / exact.norm()) < 1e-3


@x8_kernel
def test_int8_activations_of_zero_and_non_finite_groups() -> None:
    w = k_quant(32, 512, seed=4, offsets=True)
    packed = pack(w, code_bits=6, superblocks=True)
    reference = lambda x: int8_activation_product(x, w.dequantize(), w.offset)  # noqa: E731
    assert_int8_activation_edges(matmul, packed, reference, 512)


@kernel
def test_kernel_ignores_the_lane_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the bf16-pair kernel reads superblock constants: the switch that sends six-bit
    codes to the fp32 kernels leaves these weights where they are."""
    w = k_quant(48, 512)
    packed = pack(w, code_bits=6, superblocks=True)
    x = torch.randn(3, 512).to(torch.bfloat16)
    y = matmul(x, packed)
    monkeypatch.setenv("SPECSERVE_INT8_AVX512", "0")
    assert torch.equal(matmul(x, packed), y)


@pytest.mark.skipif(
    not (int8_native.available() and superblock.preferred()),
    reason="superblock constants are not packed on this host",
)
@pytest.mark.slow
def test_the_default_files_q6_k_tensors_take_superblock_constants() -> None:
    """The 1.5B's LM head and a Q6_K down projection: their constants factor, and the
    kernel's fp32 outputs equal a float64 product of llama.cpp's dequantisation to fp32
    rounding."""
    import gguf

    from specserve.loading.gguf_blocks import decode
    from specserve.loading.loader import resolve_source

    path = resolve_source("qwen2.5-coder-1.5b-instruct")[1]  # fetched on first use
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        if t.name not in ("output.weight", "blk.0.ffn_down.weight"):
            continue
        blocks = decode(t.data, t.tensor_type, (int(t.shape[1]), int(t.shape[0])))
        assert blocks is not None and blocks.source_type == "Q6_K"
        w = Int8GroupWeight(blocks.codes[:2048], blocks.scale[:2048], blocks.offset[:2048], 16)
        packed = pack(w, code_bits=6, superblocks=True)
        assert packed.superblock_form == 1 and packed.group_size == 256
        x = torch.randn(4, w.in_features).to(torch.bfloat16)
        ref = x.double() @ blocks.dequantize()[:2048].double().T
        if not packed.quads:
            with pytest.MonkeyPatch.context() as env:  # bf16 activations: the exact products
                env.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")
                y = matmul(x.float(), packed)
            assert float((y.double() - ref).norm() / ref.norm()) < 1e-5
        if packed.quads or torch.ops.specserve.int4_int8_activations():  # int8 activations
            ref8 = int8_activation_product(x, blocks.dequantize()[:2048], blocks.offset[:2048])
            y8 = matmul(x.float(), packed)
            assert float((y8.double() - ref8).norm() / ref8.norm()) < 1e-5
