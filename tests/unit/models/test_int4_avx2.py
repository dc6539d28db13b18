"""The AVX2 / FMA / F16C variant of the int4 kernel (csrc/int4_gemv.cpp), built on its own.

On a CPU without AVX-512 BF16 / GFNI, ``-march=native`` compiles the AVX2 variant; these tests
build int4_gemv.cpp alone with torch's cpp_extension (a few seconds, independent of the other
sources of the op library) and check ``torch.ops.specserve.int4_gemm``: accuracy against a
float64 reference and bit-identical rows whatever the batch, the thread split, the group size
or the output dtype. On an AVX-512 BF16 CPU they are skipped (test_int4_native.py covers that
variant through the normal build).
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from specserve.models.native import build, int4_native
from specserve.models.native.int4_native import Int4Packed, pack
from specserve.models.quant.int4_weight import Int4Weight

_, _FLAGS = build.cpu_signature()
_AVX2 = platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "fma", "f16c"} <= _FLAGS
_AVX512 = {"avx512_bf16", "gfni"} <= _FLAGS

pytestmark = pytest.mark.skipif(
    not _AVX2 or _AVX512 or shutil.which("c++") is None,
    reason="the AVX2 int4 kernel variant is what -march=native builds only on an AVX2 CPU "
    "without AVX-512 BF16 / GFNI (and needs a C++ compiler)",
)

Gemm = Callable[..., torch.Tensor]


@pytest.fixture(autouse=True)
def int16_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the int16 form of x (the variant's exact path); groups of a multiple
    of 32 take int8 activations by default (test_int4_native.py checks those)."""
    monkeypatch.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")


def _op_loaded() -> bool:
    try:
        torch.ops.specserve.int4_gemm  # noqa: B018 (the lookup raises when not registered)
    except (AttributeError, RuntimeError):
        return False
    return True


@pytest.fixture(scope="module")
def int4_gemm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gemm]:
    """``torch.ops.specserve.int4_gemm`` from int4_gemv.cpp alone, or from the op library
    when it builds. The normal load is tried first: once decided it is cached for the session,
    so nothing later loads the library over this one (the op names would clash)."""
    if not int4_native.available() and not _op_loaded():
        from torch.utils import cpp_extension

        directory: Path = tmp_path_factory.mktemp("int4_avx2")
        bin_dir = str(Path(sys.executable).parent)  # ninja lives in the venv
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = bin_dir + os.pathsep + path
        try:
            cpp_extension.load(
                name="specserve_int4_avx2_test",
                sources=[str(build.CSRC / "int4_gemv.cpp")],
                extra_cflags=list(build.CFLAGS),
                build_directory=str(directory),
                is_python_module=False,
            )
        finally:
            os.environ["PATH"] = path
    yield torch.ops.specserve.int4_gemm


def _weight(n: int, k: int, group_size: int, seed: int = 0) -> Int4Weight:
    gen = torch.Generator().manual_seed(seed)
    return Int4Weight(
        torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen),
        torch.rand(n, k // group_size, generator=gen) * 0.02 + 0.005,
        -torch.rand(n, k // group_size, generator=gen) * 0.1,
        group_size,
    )


def _call(op: Gemm, x: torch.Tensor, packed: Int4Packed) -> torch.Tensor:
    return op(
        x, packed.qweight, packed.scales, packed.row_scale, packed.out_features, packed.group_size
    )


def _bits(y: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int16 if y.dtype == torch.bfloat16 else torch.int32)


@pytest.mark.parametrize(("n", "k", "gs"), [(37, 128, 32), (1000, 256, 64), (50, 384, 128)])
def test_matches_float64_reference(int4_gemm: Gemm, n: int, k: int, gs: int) -> None:
    weight = _weight(n, k, gs)
    packed = pack(weight)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = x.double() @ weight.dequantize(torch.float64).T
    y32 = _call(int4_gemm, x.float(), packed)  # fp32 out: only the fp16 scales' rounding
    y16 = _call(int4_gemm, x, packed)
    assert y32.dtype == torch.float32 and y16.dtype == torch.bfloat16
    assert y32.shape == y16.shape == (5, n)
    assert float((y32.double() - ref).norm() / ref.norm()) < 1e-3
    # bf16 out: the fp32 result rounded to nearest even.
    assert torch.equal(y16, y32.to(torch.bfloat16))
    # the constants apart (the earlier layout): the same arithmetic, the same bits
    split = pack(weight, inline_constants=False)
    assert torch.equal(_call(int4_gemm, x.float(), split), y32)
    for m in (1, 2, 3):
        assert torch.equal(_call(int4_gemm, x[:m], split), _call(int4_gemm, x[:m], packed))


@pytest.mark.parametrize(("n", "gs"), [(37, 8), (37, 64), (1000, 32), (1000, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("inline", [True, False])
def test_rows_are_bit_identical_whatever_the_batch(
    int4_gemm: Gemm, n: int, gs: int, dtype: torch.dtype, inline: bool
) -> None:
    k = 256
    packed = pack(_weight(n, k, gs, seed=n + gs), inline_constants=inline)
    x = torch.randn(20, k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    x = x.to(dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = torch.cat([_call(int4_gemm, x[i : i + 1], packed) for i in range(20)])
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            for m in range(1, 21):
                y = _call(int4_gemm, x[:m], packed)
                assert torch.equal(_bits(y), _bits(single[:m])), (num_threads, m)
    finally:
        torch.set_num_threads(threads)


def test_row_does_not_depend_on_other_rows(int4_gemm: Gemm) -> None:
    n, k = 1000, 512
    packed = pack(_weight(n, k, 64))
    gen = torch.Generator().manual_seed(3)
    row = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    alone = _call(int4_gemm, row, packed)
    for m in (2, 5, 9, 16):
        others = (torch.randn(m, k, generator=gen) * 1e3).to(torch.bfloat16)
        others[m // 2] = row[0]
        assert torch.equal(_call(int4_gemm, others, packed)[m // 2], alone[0])


def test_inputs_within_a_group_span_magnitudes(int4_gemm: Gemm) -> None:
    """Each row's groups become 16-bit integers times a power of two: an outlier beside tiny
    inputs, a zero group and inputs near the smallest normals stay close to float64."""
    n, k, gs = 64, 256, 32
    weight = _weight(n, k, gs, seed=4)
    packed = pack(weight)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, k, generator=gen) * 1e-3
    x[0, 3] = 3000.0  # one outlier in the first group
    x[1, :gs] = 0.0  # a zero group
    x[2] *= 1e-30  # every group far below 1
    x[3, gs : 2 * gs] *= 1e-34  # one group of tiny inputs beside ordinary ones
    x = x.to(torch.bfloat16)
    ref = x.double() @ weight.dequantize(torch.float64).T
    y = _call(int4_gemm, x.float(), packed)
    for m in range(4):
        assert float((y[m].double() - ref[m]).norm() / ref[m].norm()) < 1e-3, m
        assert torch.equal(_call(int4_gemm, x[m : m + 1].float(), packed)[0], y[m])


def test_a_non_finite_input_makes_only_its_row_nan(int4_gemm: Gemm) -> None:
    n, k = 40, 256
    packed = pack(_weight(n, k, 32, seed=6))
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    clean = _call(int4_gemm, x, packed)
    for bad in (float("nan"), float("inf"), float("-inf")):
        dirty = x.clone()
        dirty[1, 70] = bad
        y = _call(int4_gemm, dirty, packed)
        assert torch.isnan(y[1]).all(), bad
        assert torch.equal(y[0], clean[0]) and torch.equal(y[2], clean[2])


def test_groups_above_the_integer_sums_range_are_refused(int4_gemm: Gemm) -> None:
    k = 8192  # one group of 8192 inputs: its integer sum could pass 2^31
    packed = pack(_weight(16, k, k, seed=8))
    with pytest.raises(RuntimeError, match="group_size 8192 is above 4096"):
        _call(int4_gemm, torch.randn(2, k).to(torch.bfloat16), packed)
