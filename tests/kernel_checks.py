"""Checks shared by the tests of the native quantised kernels."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def assert_exact_and_batch_invariant(
    matmul: Callable[[torch.Tensor, object], torch.Tensor],
    packed: object,
    weight: torch.Tensor,
    rows: int = 11,
    reference: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """``matmul(x, packed)`` against ``x @ weight.T`` in float64 (or ``reference(x)``, the
    float64 product a kernel's own arithmetic approximates) for ``rows`` random bf16 rows:
    fp32 outputs within fp32 rounding (only the kernel's sums differ), bf16 outputs within bf16
    rounding, and every split of the rows into calls bit-identical to one call."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, weight.shape[1], generator=gen).to(torch.bfloat16)
    ref = reference(x) if reference is not None else x.double() @ weight.double().T
    y32 = matmul(x.float(), packed)
    assert float((y32.double() - ref).norm() / ref.norm()) < 1e-5
    y = matmul(x, packed)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    for size in (1, 2, 3, 5, 8, rows):
        parts = [matmul(x[i : i + size], packed) for i in range(0, rows, size)]
        assert torch.equal(torch.cat(parts), y), size


def int8_activation_product(
    x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """The float64 product a kernel on int8 activations computes to fp32 rounding (``weight``
    = codes times scales plus ``offsets``, one per group of ``K / offsets.shape[1]`` inputs):
    per row and group of 32 inputs, step = max |x| / 127 and xq = x / step rounded to nearest
    even (in fp32, as the kernels), the codes' term on xq * step, the offsets' term on x."""
    rows, k = x.shape
    g = x.float().view(rows, k // 32, 32)
    top = g.abs().amax(-1, keepdim=True)
    safe = torch.where(top > 0, top, torch.ones_like(top))
    xq = torch.where(top > 0, torch.round(g * (torch.tensor(127.0) / safe)), 0.0)
    step = torch.where(top > 0, safe / torch.tensor(127.0), 0.0)
    x_hat = (xq.double() * step.double()).view(rows, k)
    per_input = offsets.double().repeat_interleave(k // offsets.shape[1], dim=1)
    return x_hat @ (weight.double() - per_input).T + x.double() @ per_input.T


def assert_int8_activation_edges(
    matmul: Callable[[torch.Tensor, object], torch.Tensor],
    packed: object,
    reference: Callable[[torch.Tensor], torch.Tensor],
    k: int,
) -> None:
    """On int8 activations: an all-zero group of 32 inputs contributes nothing (fp32 outputs
    within fp32 rounding of ``reference(x)``, the float64 product of the same rounding), and a
    row holding a NaN or an infinity gives NaN outputs and leaves the other rows' bits alone."""
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    x[0, 32:64] = 0.0
    y = matmul(x.float(), packed).double()
    ref = reference(x)
    assert float((y - ref).norm() / ref.norm()) < 1e-5
    for bad in (float("nan"), float("inf")):
        xb = x.clone()
        xb[1, 100] = bad
        yb = matmul(xb, packed)
        assert torch.isnan(yb[1]).all()
        assert torch.equal(yb[[0, 2]], matmul(x, packed)[[0, 2]])


def assert_int8_activations_switch_off(
    matmul: Callable[[torch.Tensor, object], torch.Tensor],
    packed: object,
    weight: torch.Tensor,
    env: pytest.MonkeyPatch,
    bound: float,
    off_bound: float = 1e-5,
) -> None:
    """Int8 activations (the default) stay within ``bound`` of the exact product ``x @ weight.T``
    but not within fp32 rounding of it; ``SPECSERVE_INT8_ACTIVATIONS=0`` (set through ``env``,
    a ``pytest.MonkeyPatch``) gives the exact product to ``off_bound`` (fp32 rounding; more
    where that kernel rounds x too, as the AVX2 int4 kernel's int16 form)."""
    x = torch.randn(5, weight.shape[1], generator=torch.Generator().manual_seed(2))
    x = x.to(torch.bfloat16)
    exact = x.double() @ weight.double().T
    on = matmul(x.float(), packed).double()
    env.setenv("SPECSERVE_INT8_ACTIVATIONS", "0")
    off = matmul(x.float(), packed).double()
    assert float((off - exact).norm() / exact.norm()) < off_bound
    assert off_bound < float((on - exact).norm() / exact.norm()) < bound
