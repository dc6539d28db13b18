"""The native bf16 matmul (models/native/bf16_native.py): accuracy against a float64
reference, rows bit-identical whatever the batch and the thread split (on the AMX tiles and on
the AVX-512 / AVX2 kernel, ``SPECSERVE_BF16_AMX``) and whatever the prefetch
(``SPECSERVE_SWEEP_PREFETCH``), argument errors, the environment switches and the fallback
reason."""

from __future__ import annotations

import logging

import pytest
import torch

from specserve.models.native import bf16_native, build

native = pytest.mark.skipif(
    not bf16_native.available(), reason=f"native bf16 kernel: {bf16_native.unavailable_reason()}"
)


@pytest.fixture(params=["tiles", "no tiles"])
def amx_switch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: AMX tiles allowed (where the CPU has them) and switched off."""
    monkeypatch.setenv("SPECSERVE_BF16_AMX", "1" if request.param == "tiles" else "0")
    return str(request.param)


def _data(n: int, k: int, m: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    return w, b, x


@native
@pytest.mark.parametrize(("n", "k"), [(1, 16), (37, 48), (37, 64), (1000, 1536), (130, 8960)])
def test_close_to_a_float64_reference(n: int, k: int, amx_switch: str) -> None:
    w, b, x = _data(n, k, 7)
    ref = x.double() @ w.double().T + b.double()
    y = bf16_native.matmul(x, w, b)
    assert y.dtype == torch.bfloat16 and y.shape == (7, n)
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < 4e-3, err  # bf16 rounding of the outputs (~2e-3), fp32 sums


@native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k", [256, 80])
def test_rows_are_bit_identical_whatever_the_batch(threads: int, k: int, amx_switch: str) -> None:
    """Every row of an M-row call equals the same row computed alone or among other rows,
    for every M the kernel blocks differently (1, 2, 3, 4-6 on AVX-512 and 4-5 on AVX2, 7
    and 8 in one block on AVX-512, several row blocks; on the AMX tiles up to 16 rows a
    block, and from two blocks on, pairs of them against pairs of weight blocks: M = 17-20
    takes one pair, of equal or unequal blocks, M = 33-48 a pair and one block left over,
    M = 49-52 two pairs); K = 80 ends in a half chunk on the AVX-512 BF16 variant (chunks of
    32 inputs) and stays off the tiles; N = 1003 leaves 11 rows that the tiles hand to the
    AVX-512 kernel, and a thread's share of 16-row weight blocks may be odd (one block alone
    beside the pairs)."""
    w, b, x = _data(1003, k, 52, seed=1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = torch.cat([bf16_native.matmul(x[i : i + 1], w, b) for i in range(52)])
        for m in (*range(1, 21), 32, 33, 35, 47, 48, 49, 50, 52):
            assert torch.equal(bf16_native.matmul(x[:m], w, b), alone[:m]), m
        assert torch.equal(bf16_native.matmul(x[5:10], w, b), alone[5:10])
    finally:
        torch.set_num_threads(before)


@native
def test_the_sweep_prefetch_changes_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep (each block of weight rows prefetches the next block, for blocks of up to
    32 KiB on AVX2 and 256 KiB on AVX-512) moves reads only: on (the default) and off
    (``SPECSERVE_SWEEP_PREFETCH=0``) give the same bits for every blocking of x rows, for K
    whose blocks take the sweep (1536, and 1552, whose last 16 inputs are a half step on
    AVX-512), K whose blocks are too large for it on AVX2 (8960) and on AVX-512 at one x row
    (16400), and for N that leaves the last rows of a task without a next block
    (N = 16 * 7 + 5)."""
    for n, k in ((16 * 7 + 5, 1536), (16 * 7 + 5, 1552), (37, 8960), (21, 16400)):
        w, b, x = _data(n, k, 11, seed=3)
        for m in (1, 2, 3, 4, 5, 6, 9, 11):
            monkeypatch.setenv("SPECSERVE_SWEEP_PREFETCH", "1")
            on = bf16_native.matmul(x[:m], w, b)
            monkeypatch.setenv("SPECSERVE_SWEEP_PREFETCH", "0")
            assert torch.equal(bf16_native.matmul(x[:m], w, b), on), (n, k, m)


@native
def test_fma_pairs_give_the_vdpbf16ps_sums_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the AVX-512 BF16 kernel, sums of several x rows taken as pairs of fp32 FMAs
    (``SPECSERVE_BF16_FMA=1``, calls of 3 or more rows) equal the ``vdpbf16ps`` sums
    (``=0``) bit for bit, in fp32 before any rounding to bf16, for every blocking of x rows
    (3-5 in one block, 6-17 in balanced blocks of up to 5), a K ending in a half chunk (48,
    1552), weights and inputs with denormal values and products that underflow (both read as
    0 and flushed, as ``vdpbf16ps`` does) and lane sums whose reduction underflows (not
    flushed, as the ``vdpbf16ps`` kernel reduces them), and N leaving rows beside the blocks
    of 4 and groups of weight rows shorter than the others (K = 8960: groups of 12 and 8); the
    library reports the switch."""
    monkeypatch.setenv("SPECSERVE_BF16_AMX", "0")
    if bf16_native.kernel() != "AVX-512 BF16":
        pytest.skip("the FMA pairs are an AVX-512 BF16 kernel's form")
    no_bias = torch.empty(0, dtype=torch.bfloat16)
    for n, k in ((37, 48), (16 * 5 + 3, 1552), (21, 8960)):
        w, b, x = _data(n, k, 17, seed=4)
        # Weight rows 0, 5, 10, ... denormal throughout, 1, 6, ... near 2^-70, 2, 7, ... near
        # 2^-64; x rows 0, 4, ... near 2^-60: products read as 0 (DAZ), sums below 2^-126
        # (flushed, FTZ), and lane sums near 2^-123 whose reduction to one value may fall
        # below 2^-126 (reduced as the vdpbf16ps kernel reduces them, without FTZ).
        scales = {0: 2.0**-130, 1: 2.0**-70, 2: 2.0**-64}
        w_scale = torch.tensor([scales.get(i % 5, 1.0) for i in range(n)])
        w = (w.float() * w_scale[:, None]).to(torch.bfloat16)
        x_scale = torch.tensor([2.0**-60 if i % 4 == 0 else 1.0 for i in range(17)])
        x = (x.float() * x_scale[:, None]).to(torch.bfloat16).float()  # fp32 x: fp32 sums out
        for m in range(3, 18):
            for bias in (b, no_bias):
                monkeypatch.setenv("SPECSERVE_BF16_FMA", "1")
                assert bf16_native.fma_pairs()
                pairs = torch.ops.specserve.bf16_gemm(x[:m], w, bias)
                monkeypatch.setenv("SPECSERVE_BF16_FMA", "0")
                assert not bf16_native.fma_pairs()
                dp = torch.ops.specserve.bf16_gemm(x[:m], w, bias)
                assert pairs.dtype == torch.float32 and torch.equal(pairs, dp), (n, k, m)


@native
def test_leading_dimensions_and_no_bias() -> None:
    w, _, x = _data(48, 32, 6, seed=2)
    y = bf16_native.matmul(x.view(2, 3, 32), w)
    assert y.shape == (2, 3, 48)
    assert torch.equal(y.view(6, 48), bf16_native.matmul(x, w))
    ref = x.double() @ w.double().T
    assert float((y.view(6, 48).double() - ref).norm() / ref.norm()) < 4e-3


@native
def test_bad_arguments_raise_clear_errors() -> None:
    w, b, x = _data(8, 32, 2)
    with pytest.raises(ValueError, match="CPU bf16 inputs"):
        bf16_native.matmul(x.float(), w)
    with pytest.raises(ValueError, match=r"inputs \[\.\.\., 32\]"):
        bf16_native.matmul(x[:, :16], w)
    with pytest.raises(ValueError, match="bf16 weight"):
        bf16_native.matmul(x, w.float())
    with pytest.raises(RuntimeError, match="not a multiple of 16"):
        bf16_native.matmul(x[:, :24], w[:, :24].contiguous())
    with pytest.raises(RuntimeError, match="bias must be"):
        bf16_native.matmul(x, w, b[:4])


@native
def test_kernel_names_the_variant_and_the_amx_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    flags = build.cpu_signature()[1]
    monkeypatch.setenv("SPECSERVE_BF16_AMX", "0")
    off = bf16_native.kernel()
    assert off == ("AVX-512 BF16" if "avx512_bf16" in flags else "AVX2")
    monkeypatch.setenv("SPECSERVE_BF16_AMX", "1")
    if {"amx_tile", "amx_bf16"} <= flags:
        assert bf16_native.kernel() == "AMX tiles"
        monkeypatch.setenv("SPECSERVE_BF16_AMX", "0")  # read on every call
        assert bf16_native.kernel() == off
    else:
        assert bf16_native.kernel() == off


def test_env_switch_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_BF16_NATIVE", "0")
    monkeypatch.setattr(bf16_native._kernel, "state", {})  # as in a fresh process
    assert not bf16_native.available()
    assert "SPECSERVE_BF16_NATIVE" in (bf16_native.unavailable_reason() or "")
    assert bf16_native._kernel.state == {}  # nothing was built or loaded
    w, _, x = _data(8, 32, 1)
    with pytest.raises(RuntimeError, match="not loaded"):
        bf16_native.matmul(x, w)


def test_a_failed_build_is_reported_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(bf16_native._kernel, "state", {})
    monkeypatch.setattr(bf16_native.build, "load_library", lambda: "this CPU lacks avx2")
    with caplog.at_level(logging.WARNING, logger=bf16_native.__name__):
        assert not bf16_native.available()
        assert not bf16_native.available()
    assert bf16_native.unavailable_reason() == "this CPU lacks avx2"
    assert sum("lacks avx2" in r.getMessage() for r in caplog.records) == 1  # logged once
