"""Checks shared by the tests of the native quantised kernels."""

from __future__ import annotations

from collections.abc import Callable

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
