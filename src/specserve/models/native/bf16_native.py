"""Native batch-invariant bf16 matmul for decode and verify steps, built on first use.

``y = x @ w.T (+ b)`` for bf16 activations ``x # [M, K]`` and a bf16 weight ``w # [N, K]`` as
the model stores it (no repacking, no second copy): the bf16 products are exact in fp32 and
accumulate in a fixed order per output (``csrc/bf16_gemm.cpp``: AMX tiles where the CPU has
AMX BF16, else ``vdpbf16ps`` where it has AVX-512 BF16, else AVX2 FMAs), so a row's result is
bit for bit the same whatever ``M``, the other rows or the thread split (on a given CPU and
setting of ``SPECSERVE_BF16_AMX``: the variants sum in different orders, :func:`kernel` says
which one runs). That is what makes greedy speculative decoding in bf16 return exactly plain
decoding's tokens: a ``k + 1``-row verify computes each row as a 1-row decode step would. It
is also faster than PyTorch's bf16 linear on CPU for the row counts of decoding (one pass over
the weights serves up to six rows, five on AVX2; on the AMX tiles, up to sixteen, at the cost
of one).

Used by the fused bf16 decoder layer (``fused_layer.py``, op
``torch.ops.specserve.bf16_decoder_layer``) and for the LM head of bf16 models
(:func:`matmul`). :func:`available` is False (the reason logged once, see
:func:`unavailable_reason`) when ``SPECSERVE_BF16_NATIVE=0``, on a CPU without AVX2 / FMA /
F16C, or when the build or the self-test fails; callers then keep PyTorch's path.
"""

from __future__ import annotations

import logging

import torch

from specserve.models.native import build
from specserve.models.native.availability import Availability

logger = logging.getLogger(__name__)

__all__ = ["K_MULTIPLE", "available", "kernel", "matmul", "unavailable_reason"]

K_MULTIPLE = 16  # the kernel's input features must be a multiple of this
_ENV_SWITCH = "SPECSERVE_BF16_NATIVE"
_NO_BIAS = torch.empty(0, dtype=torch.bfloat16)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x # [..., K]`` (CPU bf16) @ ``weight # [N, K]`` (contiguous CPU bf16) ``.T`` (+ ``bias``)
    -> ``# [..., N]`` bf16. Call only after :func:`available` returned True.

    Raises:
        ValueError: wrong dtype, device or shape of an argument.
        RuntimeError: the kernel is not loaded.
    """
    if weight.dtype != torch.bfloat16 or not weight.is_cpu or weight.dim() != 2:
        raise ValueError(
            f"bf16 matmul takes a CPU bf16 weight [N, K], got {weight.dtype} "
            f"{tuple(weight.shape)} on {weight.device}"
        )
    k = weight.shape[1]
    if x.dtype != torch.bfloat16 or not x.is_cpu or x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(
            f"bf16 matmul takes CPU bf16 inputs [..., {k}], got {x.dtype} {tuple(x.shape)} on "
            f"{x.device}"
        )
    if not _kernel.loaded():
        raise RuntimeError(f"the native bf16 kernel is not loaded: {unavailable_reason()}")
    x2 = x.reshape(-1, k)
    y = torch.ops.specserve.bf16_gemm(
        x2, weight.contiguous(), _NO_BIAS if bias is None else bias.contiguous()
    )
    return y.view(*x.shape[:-1], weight.shape[0])


def _self_test() -> str | None:
    """Run the kernel on a small random weight: close to a float64 reference, and each row of
    a 5-row call bit-identical to the same row alone (catches a miscompiled kernel)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(37, 64, generator=gen).to(torch.bfloat16)
    b = torch.randn(37, generator=gen).to(torch.bfloat16)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    try:
        y = torch.ops.specserve.bf16_gemm(x, w, b)
        rows = [torch.ops.specserve.bf16_gemm(x[i : i + 1], w, b) for i in range(5)]
    except Exception as exc:  # the op refuses this CPU
        return f"self-test failed: {type(exc).__name__}: {exc}"
    ref = x.double() @ w.double().T + b.double()
    err = float((y.double() - ref).norm() / ref.norm())
    if not err < 1e-2:
        return f"self-test failed: relative error {err:.3g} against the reference"
    if not torch.equal(y, torch.cat(rows)):
        return "self-test failed: rows depend on the batch"
    return None


_kernel = Availability("bf16", _ENV_SWITCH, lambda: build.load_library() or _self_test(), logger)


def available() -> bool:
    """Whether :func:`matmul` can run here (builds / loads the library on the first call).

    False when ``SPECSERVE_BF16_NATIVE=0`` (checked on every call), or after a failed build /
    an unsupported CPU (decided once per process, the reason logged once).
    """
    return _kernel.available()


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True or was never asked)."""
    return _kernel.unavailable_reason()


_VARIANTS = ("AVX2", "AVX-512 BF16", "AMX tiles")


def kernel() -> str | None:
    """The kernel bf16 matmuls run on now, as the library says: ``"AMX tiles"`` (where the
    build has AMX, the OS grants the tile state and neither ``SPECSERVE_AMX`` nor
    ``SPECSERVE_BF16_AMX`` is ``0``; read on every call, like the kernel reads the
    switches), ``"AVX-512 BF16"`` or ``"AVX2"``; None where :func:`available` is False.
    Weights whose K is not a multiple of 32 stay on the AVX-512 kernel under AMX."""
    if not available():
        return None
    return _VARIANTS[int(torch.ops.specserve.bf16_kernel_variant())]


def fma_pairs() -> bool:
    """Whether the AVX-512 BF16 kernel now sums calls of 3 or more x rows as pairs of fp32
    FMAs instead of ``vdpbf16ps`` (``csrc/bf16_gemm.cpp``): the same bits, chosen where a
    one-off timing at first use finds two 512-bit FMAs faster than one ``vdpbf16ps`` (as on
    Intel cores), or forced with ``SPECSERVE_BF16_FMA=1`` / ``0`` (read on every call).
    False where the library is not available, on AVX2 builds and under the AMX tiles."""
    return available() and kernel() == "AVX-512 BF16" and bool(torch.ops.specserve.bf16_fma_pairs())


def describe_kernel() -> str | None:
    """:func:`kernel`, with ``" (sums of several rows as FMA pairs)"`` where
    :func:`fma_pairs` is on: for logs and ``specserve:model_info``."""
    name = kernel()
    return f"{name} (sums of several rows as FMA pairs)" if name and fma_pairs() else name
