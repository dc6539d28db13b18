"""Weight-only int8 / int4 linear layers and embeddings (activations stay bf16/fp32).

Terms:
    weight-only quantisation: only the stored weights are integers; every matmul sees the
        activations unchanged and dequantises (inside the kernel) with fixed per-weight
        scales. No scale depends on the activations, so the result for one row of a batch
        never depends on the other rows (*batch invariant*): a k + 1-token verification and
        a 1-token decode step compute the same numbers for the same token. Dynamic activation
        quantisation (per-tensor scales) breaks exactly that and is not offered.
    int8: symmetric, one scale per output channel: ``w ≈ q * scale``, ``q ∈ [-127, 127]``.
    int4: asymmetric, one (scale, min) pair per group of ``group_size`` consecutive input
        channels of an output channel: ``w ≈ q * scale + min``, ``q ∈ [0, 15]``. The
        per-group range is clipped by a small search that minimises the group's squared
        error (plain min/max wastes levels on outliers).

On CPU the matmuls run in packed kernels: int8 in PyTorch's ``aten::_weight_int8pack_mm``;
int4 in specserve's own AVX-512 kernel (models/native/int4_native.py, built on first use) where the
CPU has AVX-512 BF16, else in PyTorch's ``aten::_weight_int4pack_mm_for_cpu``. Both are fast
for bf16 activations. Elsewhere (or when ``use_packed`` is off) the layer dequantises and
calls ``F.linear``: slower, same result up to rounding. Portable tensors
(:class:`Int4Weight`) are what the on-disk cache stores; the CPU packing is redone at load
(it takes seconds).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from specserve.models.native import int4_native, int4_superblock
from specserve.models.native.int4_native import Int4Packed
from specserve.models.quant.int4_weight import (
    ROW_CHUNK,
    Int4Weight,
)

QuantFormat = Literal["int8", "int4"]
_INT4_N_MULTIPLE = 16  # the CPU int4 packing wants N divisible by 16; we pad rows


def _packed_ok(device: torch.device) -> bool:
    return device.type == "cpu"


_ALIGN = 64  # bytes; what PyTorch's CPU allocator guarantees


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a contiguous copy when its data is not 64-byte aligned.

    Tensors read from a safetensors file sit at the file's (8-byte aligned) offsets, and
    ``_weight_int8pack_mm`` reads out of bounds (segfaults) on such a weight for some batch
    sizes (seen with M = 4 on a 896 x 896 weight at offset 56 mod 64).
    """
    if t.is_contiguous() and t.data_ptr() % _ALIGN == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


# ---------------------------------------------------------------- int8 ----------------------


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight # [N, K]`` -> (``q # [N, K] int8``, ``scale # [N] fp32``), symmetric."""
    qs, ss = [], []
    for chunk in weight.split(ROW_CHUNK):
        w = chunk.float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-10)  # [n]
        qs.append(torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        ss.append(scale)
    return torch.cat(qs), torch.cat(ss)


class Int8Linear(nn.Module):
    """``y = x @ (q * scale).T + bias`` with ``q # [N, K] int8``, ``scale # [N]``."""

    def __init__(
        self,
        qweight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        assert qweight.dtype == torch.int8 and qweight.dim() == 2
        self.out_features, self.in_features = qweight.shape
        self.qweight: torch.Tensor
        self.scale: torch.Tensor
        self.bias: torch.Tensor | None
        self.register_buffer("qweight", _aligned(qweight))
        self.register_buffer("scale", _aligned(scale.to(dtype)))  # [N] in the compute dtype
        self.register_buffer("bias", None if bias is None else bias.to(dtype))
        self.use_packed = _packed_ok(qweight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if self.use_packed:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scale.to(x.dtype))
        else:
            w = self.qweight.to(x.dtype) * self.scale.to(x.dtype)[:, None]
            y = F.linear(x2, w)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 per-channel"


# ---------------------------------------------------------------- int4 ----------------------


def _pack_int4_rows(weight: Int4Weight, pad: int) -> torch.Tensor:
    """The CPU kernel's packed layout of ``weight`` (plus ``pad`` zero rows), built a row
    chunk at a time: the packing op takes int32 codes, 8 bytes per weight with the padding
    copy, which for a whole LM head (152k x 1.5k) would be ~2 GB of temporaries. The CPU
    layout packs each output row on its own, so chunks concatenate to the whole."""
    n = weight.nibbles.shape[0]
    chunks = []
    for start in range(0, n, ROW_CHUNK):
        rows = Int4Weight(
            weight.nibbles[start : start + ROW_CHUNK],
            weight.scale[start : start + ROW_CHUNK],
            weight.minimum[start : start + ROW_CHUNK],
            weight.group_size,
        )
        codes = rows.codes().to(torch.int32)
        if start + ROW_CHUNK >= n and pad:
            codes = F.pad(codes, (0, 0, 0, pad))
        chunks.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


class Int4Linear(nn.Module):
    """Linear layer over :class:`Int4Weight`; on CPU through a packed int4 kernel.

    Args:
        native: use specserve's kernel (models/native/int4_native.py); None = where it is available
            (CPU, AVX-512 BF16, it builds, ``SPECSERVE_INT4_NATIVE`` not 0) and the compute
            dtype is bf16 (the kernel rounds activations to bf16, which an fp32 model must
            not). Its results are bit-identical for a row whatever the batch, like PyTorch's
            kernel, but not the same numbers as PyTorch's kernel (fp16 group scales, a
            different summation order).
    """

    def __init__(
        self,
        weight: Int4Weight,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        use_packed: bool | None = None,
        native: bool | None = None,
    ) -> None:
        super().__init__()
        self.out_features = weight.nibbles.shape[0]
        self.in_features = weight.nibbles.shape[1] * 2
        self.group_size = weight.group_size
        device = torch.device(device)
        self.use_packed = _packed_ok(device) if use_packed is None else use_packed
        self.qweight: torch.Tensor
        self.scales_and_zeros: torch.Tensor
        self.bias: torch.Tensor | None
        self.register_buffer("bias", None if bias is None else bias.to(device, dtype))
        self.native: Int4Packed | None = None
        want_native = native if native is not None else dtype == torch.bfloat16
        if self.use_packed and want_native and device.type == "cpu":
            if int4_native.available():
                # superblock constants where the weight has Q4_K's form, else per group
                self.native = int4_superblock.packed_or_none(weight) or int4_native.pack(weight)
                self._native_matmul = int4_native.matmul
            elif native:
                raise RuntimeError(
                    f"native int4 kernel requested but {int4_native.unavailable_reason()}"
                )
        if self.native is not None:
            # The packed tensors are buffers (state_dict, memory accounting); the dataclass
            # holds the same tensors for the kernel call.
            self.register_buffer("qweight", self.native.qweight)
            self.register_buffer("scales_and_zeros", self.native.scales)
            self.register_buffer("row_scale", self.native.row_scale)
        elif self.use_packed:
            pad = -self.out_features % _INT4_N_MULTIPLE
            scale = F.pad(weight.scale, (0, 0, 0, pad))
            # The kernel computes (q - 8) * scale + zero, so zero = minimum + 8 * scale.
            zero = F.pad(weight.minimum, (0, 0, 0, pad)) + 8.0 * scale
            self.register_buffer("qweight", _pack_int4_rows(weight, pad))  # kernel layout
            sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K/G, Np, 2]
            self.register_buffer("scales_and_zeros", sz.to(device, dtype))
        else:
            self.register_buffer("qweight", weight.nibbles.to(device))  # [N, K/2]
            sz = torch.stack([weight.scale, weight.minimum], dim=-1)  # [N, K/G, 2]
            self.register_buffer("scales_and_zeros", sz.to(device, dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:  # takes [..., K]; fewest ops on the decode path
            y = self._native_matmul(x, self.native)
            return y if self.bias is None else y + self.bias
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if self.use_packed:
            sz = self.scales_and_zeros.to(x.dtype)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.qweight, self.group_size, sz)
            y = y[:, : self.out_features]
        else:
            y = F.linear(x2, self._dequantize(x.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def _dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        n, k, gs = self.out_features, self.in_features, self.group_size
        lo, hi = self.qweight & 0xF, self.qweight >> 4
        q = torch.stack([lo, hi], dim=-1).view(n, k // gs, gs).to(dtype)
        sz = self.scales_and_zeros.to(dtype)
        return (q * sz[..., 0:1] + sz[..., 1:2]).view(n, k)

    def extra_repr(self) -> str:
        kernel = "native" if self.native is not None else "aten" if self.use_packed else "dequant"
        return (
            f"in={self.in_features}, out={self.out_features}, int4 group={self.group_size}, "
            f"kernel={kernel}"
        )


# ------------------------------------------------------------- embedding --------------------


class Int8Embedding(nn.Module):
    """Token embedding stored as int8 rows with one scale per row (per token).

    A lookup dequantises only the rows it reads. With tied weights and the int8 format the
    LM head shares these very tensors (a per-row scale is a per-output-channel scale there).
    """

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.qweight: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("qweight", qweight)  # [V, H] int8
        self.register_buffer("scale", scale.to(dtype))  # [V]
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(input_ids, self.qweight).to(self.dtype)  # [..., H]
        return rows * F.embedding(input_ids, self.scale.unsqueeze(-1))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 per-row"
