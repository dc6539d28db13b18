"""Int4 codes with superblock constants (models/native/int4_superblock.py): Q4_K's constants
(an fp16 ``d`` / ``dmin`` per 256 inputs times six-bit codes per 32) recovered exactly from
per-group constants or refused, the packed layout and its inverse, the byte count (the file's
4.5 bits a weight), the checks of such a weight, where ``Int4Linear`` takes the layout, and the
kernel that reads it (AVX-512 BF16 / GFNI hosts): close to a float64 reference, exact
constants (fp32 outputs within fp32 rounding), rows batch invariant, and a real Q4_K tensor of
the default GGUF file; and the same kernel on int8 activations (AVX-512 VNNI builds): its own
float64 reference, batch invariance, the switch, zero and non-finite groups."""

from __future__ import annotations

import pytest
import torch

from specserve.models.native import int4_native, int4_superblock, superblock
from specserve.models.native.int4_native import Int4Packed, matmul
from specserve.models.quant.int4_weight import Int4Weight
from specserve.models.quant.layers import Int4Linear
from tests.kernel_checks import (
    assert_exact_and_batch_invariant,
    assert_int8_activation_edges,
    assert_int8_activations_switch_off,
    int8_activation_product,
)

kernel = pytest.mark.skipif(
    not (int4_native.available() and int4_superblock.preferred()),
    reason="int4 superblock constants run on the AVX-512 BF16 / GFNI kernel only",
)


def q4_k(n: int, k: int, seed: int = 0, sign: int = 1, shared: int = 1) -> Int4Weight:
    """Int4 codes in groups of 32 with Q4_K's constants: per row and 256 inputs an fp16 ``d``
    (negative with ``sign`` -1) and ``dmin``, per 32 six-bit codes ``sc`` and ``m`` (every one
    a multiple of ``shared``: a superblock whose smallest codes are not the file's)."""
    gen = torch.Generator().manual_seed(seed)
    nsuper = k // 256
    d = (sign * (torch.rand(n, nsuper, generator=gen) * 1e-2 + 1e-3)).half().float()
    dmin = (torch.rand(n, nsuper, generator=gen) * 1e-2).half().float()
    sc = torch.randint(0, 64 // shared, (n, k // 32), generator=gen).float() * shared
    m = torch.randint(0, 64 // shared, (n, k // 32), generator=gen).float() * shared
    scale = d.repeat_interleave(8, dim=1) * sc
    minimum = -(dmin.repeat_interleave(8, dim=1) * m)
    nibbles = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    return Int4Weight(nibbles, scale, minimum, 32)


def packed(w: Int4Weight) -> Int4Packed:
    codes = w.codes()
    qweight = int4_superblock.pack(codes, w.scale, w.minimum)
    assert qweight is not None
    rows = qweight.shape[0] * 16
    return Int4Packed(
        qweight, torch.empty(0, dtype=torch.float16), torch.ones(rows), codes.shape[0], 32
    )


# ---------------------------------------------------------------- the layout -----------------


@pytest.mark.parametrize(("n", "k", "sign", "shared"), [(37, 512, 1, 1), (16, 256, -1, 3)])
def test_pack_and_unpack_round_trip(n: int, k: int, sign: int, shared: int) -> None:
    """Codes and constants come back exactly, for a negative ``d`` and for codes sharing a
    factor (whose smallest form has a ``d`` that is no fp16)."""
    w = q4_k(n, k, seed=n, sign=sign, shared=shared)
    p = packed(w)
    assert p.qweight.shape == (-(-n // 16), k // 256, 36, 64) and p.superblock_constants
    assert p.in_features == k and p.inline_constants
    codes, scale, minimum = int4_superblock.unpack(p.qweight, n)
    assert torch.equal(codes, w.codes())
    assert torch.equal(scale, w.scale) and torch.equal(minimum, w.minimum)


def test_zero_superblocks_round_trip() -> None:
    w = q4_k(16, 512)
    w.scale[:, :8] = 0.0
    w.minimum[3, :] = 0.0
    _, scale, minimum = int4_superblock.unpack(packed(w).qweight, 16)
    assert torch.equal(scale, w.scale) and torch.equal(minimum, w.minimum)


def test_the_layout_reads_the_files_bytes() -> None:
    """144 bytes a row and superblock (Q4_K's), against 160 with per-group fp16 constants."""
    w = q4_k(64, 1536)
    assert packed(w).qweight.numel() == 64 * 6 * 144
    per_group = int4_native.pack(w)
    assert per_group.qweight.numel() == 64 * 6 * 160


@pytest.mark.parametrize(
    "case", ["arbitrary scales", "mixed signs", "codes above 63", "K not a multiple of 256"]
)
def test_pack_refuses_constants_without_the_form(case: str) -> None:
    w = q4_k(16, 512)
    scale, minimum, codes = w.scale.clone(), w.minimum.clone(), w.codes()
    if case == "arbitrary scales":
        scale = torch.rand_like(scale) + 0.1
    elif case == "mixed signs":
        scale[0, 1] = -scale[0, 0] if scale[0, 0] != 0 else -1e-3
    elif case == "codes above 63":
        scale[0, :8] = torch.tensor([1.0, 64, 1, 1, 1, 1, 1, 1]) * 2**-10
    else:
        codes, scale, minimum = codes[:, :480], scale[:, :15], minimum[:, :15]
    assert int4_superblock.pack(codes, scale, minimum) is None


def test_packed_or_none_where_preferred(monkeypatch: pytest.MonkeyPatch) -> None:
    """The superblock layout where the kernel reads it and the constants have the form;
    otherwise None, so the caller packs per group."""
    w = q4_k(32, 512)
    monkeypatch.setattr(superblock, "preferred", lambda: True)
    monkeypatch.setattr(superblock, "quad_order", lambda: True)  # the AVX2 hosts' order
    assert int4_superblock.packed_or_none(w) is None
    monkeypatch.setattr(superblock, "quad_order", lambda: False)
    p = int4_superblock.packed_or_none(w)
    assert p is not None and p.superblock_constants and p.out_features == 32
    arbitrary = Int4Weight(w.nibbles, torch.rand_like(w.scale) + 0.1, w.minimum, 32)
    assert int4_superblock.packed_or_none(arbitrary) is None
    assert (
        int4_superblock.packed_or_none(
            Int4Weight(w.nibbles, w.scale[:, ::2], w.minimum[:, ::2], 64)
        )
        is None
    )
    monkeypatch.setattr(superblock, "preferred", lambda: False)
    assert int4_superblock.packed_or_none(w) is None


def test_switch_turns_the_layout_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_SUPERBLOCK_CONSTANTS", "0")
    assert not int4_superblock.preferred()


def test_packed_weight_checks_the_superblock_shapes() -> None:
    p = packed(q4_k(16, 256))
    empty = torch.empty(0, dtype=torch.float16)
    with pytest.raises(ValueError, match="uint8 \\[Np/16, K/256, 36, 64\\]"):
        Int4Packed(p.qweight[:, :, :35].contiguous(), empty, p.row_scale, 16, 32)
    with pytest.raises(ValueError, match="group_size 32"):
        Int4Packed(p.qweight, empty, p.row_scale, 16, 64)
    with pytest.raises(ValueError, match="scales must be empty"):
        Int4Packed(p.qweight, torch.zeros(4, dtype=torch.float16), p.row_scale, 16, 32)
    with pytest.raises(ValueError, match="no per-group fp16 form"):
        p.constants()
    assert p.code_blocks().shape == (1, 32, 64)


# ---------------------------------------------------------------- the kernel ---------------


@pytest.fixture
def bf16_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vdpbf16ps kernel on bf16 activations, also where int8 ones are the default."""
    monkeypatch.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")


@kernel
@pytest.mark.usefixtures("bf16_activations")
@pytest.mark.parametrize(("n", "k", "sign"), [(37, 512, -1), (160, 1536, 1), (21, 256, 1)])
def test_kernel_matches_a_float64_reference_and_is_batch_invariant(
    n: int, k: int, sign: int
) -> None:
    assert not int4_native.int8_activations()
    w = q4_k(n, k, seed=n, sign=sign)
    assert_exact_and_batch_invariant(matmul, packed(w), w.dequantize(torch.float64))


# ---------------------------------------------------------- on int8 activations ------------

x8_kernel = pytest.mark.skipif(
    not (int4_native.available() and int4_superblock.preferred())
    or not torch.ops.specserve.int4_int8_activations(),
    reason="int8 activations need the AVX-512 kernel built with VNNI",
)


def x8_reference(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """The codes centred on 8 meet the rounded x; the offsets, 8 scales included, the exact x."""
    return int8_activation_product(x, w.dequantize(torch.float64), w.minimum + 8 * w.scale)


@x8_kernel
@pytest.mark.parametrize(("n", "k", "sign"), [(37, 512, -1), (160, 1536, 1), (21, 256, 1)])
def test_int8_activations_match_their_float64_reference_and_are_batch_invariant(
    n: int, k: int, sign: int
) -> None:
    """Rows of 1 to 11 (every kernel width, the interleaved tiles of 1-3 rows included)."""
    assert int4_native.int8_activations()
    w = q4_k(n, k, seed=n, sign=sign)
    assert_exact_and_batch_invariant(
        matmul, packed(w), w.dequantize(torch.float64), reference=lambda x: x8_reference(x, w)
    )


@x8_kernel
def test_int8_activations_stay_near_the_exact_product_and_the_switch_turns_them_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = q4_k(64, 1536, seed=3)
    assert_int8_activations_switch_off(
        matmul, packed(w), w.dequantize(torch.float64), monkeypatch, 1e-2
    )
    assert not int4_native.int8_activations()


@x8_kernel
def test_int8_activations_of_zero_and_non_finite_groups() -> None:
    w = q4_k(32, 512, seed=4)
    assert_int8_activation_edges(matmul, packed(w), lambda x: x8_reference(x, w), 512)


@kernel
def test_int4_linear_takes_the_layout_for_q4_k_constants() -> None:
    """Int4Linear packs Q4_K-form weights with superblock constants and others per group; the
    same weights give the same products up to the kernels' rounding."""
    w = q4_k(48, 512, seed=5)
    layer = Int4Linear(w, None, torch.bfloat16)
    assert layer.native is not None and layer.native.superblock_constants
    other = Int4Weight(w.nibbles, w.scale * 1.0001, w.minimum, 32)  # no fp16 factor
    assert not Int4Linear(other, None, torch.bfloat16).native.superblock_constants
    x = torch.randn(2, 512).to(torch.bfloat16)
    ref = x.double() @ w.dequantize(torch.float64).T
    assert float((layer(x).double() - ref).norm() / ref.norm()) < 1e-2


@kernel
@pytest.mark.slow
def test_the_default_files_q4_k_tensors_take_superblock_constants() -> None:
    """A Q4_K projection of the 1.5B: its constants have the form, the layout holds the file's
    bytes, and the kernel's fp32 outputs equal a float64 product of llama.cpp's
    dequantisation to fp32 rounding."""
    import gguf

    from specserve.loading.gguf_blocks import decode
    from specserve.loading.loader import resolve_source

    path = resolve_source("qwen2.5-coder-1.5b-instruct")[1]  # fetched on first use
    reader = gguf.GGUFReader(str(path))
    (t,) = [t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight"]
    blocks = decode(t.data, t.tensor_type, (int(t.shape[1]), int(t.shape[0])))
    assert blocks is not None and blocks.source_type == "Q4_K"
    codes = blocks.codes[:2048].to(torch.uint8)
    qweight = int4_superblock.pack(codes, blocks.scale[:2048], blocks.offset[:2048])
    assert qweight is not None and qweight.numel() == 2048 * t.n_bytes // int(t.shape[1])
    p = Int4Packed(qweight, torch.empty(0, dtype=torch.float16), torch.ones(2048), 2048, 32)
    x = torch.randn(4, p.in_features).to(torch.bfloat16)
    ref = x.double() @ blocks.dequantize()[:2048].double().T
    with pytest.MonkeyPatch.context() as env:  # bf16 activations: the exact products
        env.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")
        y = matmul(x.float(), p)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-5
    if int4_native.int8_activations():  # and the int8 activations' products
        offsets = blocks.offset[:2048] + 8 * blocks.scale[:2048]  # the codes centred on 8
        ref8 = int8_activation_product(x, blocks.dequantize()[:2048], offsets)
        y8 = matmul(x.float(), p)
        assert float((y8.double() - ref8).norm() / ref8.norm()) < 1e-5


def _q4_1_like(n: int, k: int, seed: int) -> Int4Weight:
    """Groups of 32 with free fp32 constants (a Q4_1 block's form): no superblock factor."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.rand(n, k // 32, generator=gen) * 1e-2 + 1e-3
    minimum = -8 * scale + torch.randn(n, k // 32, generator=gen) * 1e-3
    nibbles = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    return Int4Weight(nibbles, scale, minimum, 32)


def test_has_form_tells_q4_k_constants_from_free_ones() -> None:
    assert int4_superblock.has_form(q4_k(40, 512, seed=8))
    assert int4_superblock.has_form(q4_k(40, 512, seed=8, sign=-1, shared=4))
    assert not int4_superblock.has_form(_q4_1_like(40, 512, seed=9))
    w = q4_k(40, 512, seed=8)
    sixty_four = Int4Weight(w.nibbles, w.scale[:, ::2], w.minimum[:, ::2], 64)
    assert not int4_superblock.has_form(sixty_four)  # not Q4_K's sub-groups of 32


@pytest.mark.skipif(not int4_native.available(), reason="needs the native int4 kernel")
def test_a_files_q4_k_packed_per_group_takes_int8_x_on_avx2_only() -> None:
    """``stored_linear`` keeps x exact for a file's Q4_0 / Q4_1 blocks everywhere and for its
    Q4_K ones packed per group beside the AMX tiles; the AVX2 kernel (no superblock layout)
    gives Q4_K the K-quants' int8 activations."""
    from specserve.models.quant.stored import stored_linear

    def native(w: Int4Weight) -> Int4Packed:
        packed = stored_linear(w, None, torch.bfloat16, torch.device("cpu")).native
        assert isinstance(packed, Int4Packed)
        return packed

    k_quant = native(q4_k(48, 512, seed=10))
    if not k_quant.superblock_constants:
        assert k_quant.exact_x != int4_native.quantised_x()
    q4_1 = native(_q4_1_like(48, 512, seed=11))
    assert q4_1.exact_x and not q4_1.superblock_constants
