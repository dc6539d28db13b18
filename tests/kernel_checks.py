"""Checks shared by the tests of the native quantised kernels."""

from __future__ import annotations

from collections.abc import Callable

import torch


def assert_exact_and_batch_invariant(
    matmul: Callable[[torch.Tensor, object], torch.Tensor],
    packed: object,
    weight: torch.Tensor,
    rows: int = 11,
) -> None:
    """``matmul(x, packed)`` against ``x @ weight.T`` in float64 for ``rows`` random bf16 rows:
    fp32 outputs within fp32 rounding (only the kernel's sums differ), bf16 outputs within bf16
    rounding, and every split of the rows into calls bit-identical to one call."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, weight.shape[1], generator=gen).to(torch.bfloat16)
    ref = x.double() @ weight.double().T
    y32 = matmul(x.float(), packed)
    assert float((y32.double() - ref).norm() / ref.norm()) < 1e-5
    y = matmul(x, packed)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    for size in (1, 2, 3, 5, 8, rows):
        parts = [matmul(x[i : i + size], packed) for i in range(0, rows, size)]
        assert torch.equal(torch.cat(parts), y), size
