"""Int8-group weights: signed byte codes with a (scale, offset) pair per group of inputs.

``w[n, k] = codes[n, k] * scale[n, g] + offset[n, g]``, ``g = k // group_size``: the form of
quantised formats whose codes fit a byte and whose groups are affine, so their stored codes
are computed with as they are (no re-quantisation). Formats with 4-bit codes map onto
:class:`~specserve.models.quant.int4_weight.Int4Weight` instead (half the bytes).

:class:`Int8GroupLinear` multiplies on CPU with the native int8-group kernel
(models/native/int8_native.py; bf16 activations, rows batch invariant) and takes part in the
fused decoder layers (models/native/fused_layer.py) like :class:`~.layers.Int4Linear`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specserve.models.native import int8_native
from specserve.models.native.int8_native import Int8Packed


@dataclass
class Int8GroupWeight:
    """Portable int8-group weights.

    Attributes:
        codes: ``# [N, K] int8``.
        scale: ``# [N, K // group_size] fp32``.
        offset: ``# [N, K // group_size] fp32``; ``w = codes * scale + offset`` per group.
        group_size: input channels per group.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    group_size: int

    def __post_init__(self) -> None:
        c = self.codes
        if c.dtype != torch.int8 or c.dim() != 2:
            raise ValueError(
                f"int8-group codes must be int8 [N, K], got {c.dtype} {tuple(c.shape)}"
            )
        n, k = c.shape
        gs = self.group_size
        if gs <= 0 or k % gs:
            raise ValueError(f"int8-group group_size {gs} must be positive and divide K={k}")
        for name, t in (("scale", self.scale), ("offset", self.offset)):
            if t.dtype != torch.float32 or t.shape != (n, k // gs):
                raise ValueError(
                    f"int8-group {name} must be fp32 [{n}, {k // gs}], got {t.dtype} "
                    f"{tuple(t.shape)}"
                )
            if t.device != c.device:
                raise ValueError(f"int8-group {name} is on {t.device}, the codes on {c.device}")

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.codes.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``# [N, K]`` weights, computed in fp32 and cast to ``dtype``."""
        n, k, gs = self.out_features, self.in_features, self.group_size
        q = self.codes.view(n, k // gs, gs).float()
        w = q * self.scale[..., None] + self.offset[..., None]
        return w.view(n, k).to(dtype)


class Int8GroupLinear(nn.Module):
    """Linear layer over :class:`Int8GroupWeight`.

    On CPU the native int8-group kernel (models/native/int8_native.py) computes it from the
    packed codes (buffers ``qweight``, ``scales_and_zeros``, ``row_scale``). Elsewhere (a GPU,
    fp32 compute, a CPU without AVX2, ``SPECSERVE_INT8_NATIVE=0``) the layer keeps the
    dequantised weight in the compute dtype (buffer ``weight``: 2 bytes per weight in bf16,
    twice the codes' memory) and calls ``F.linear``.

    Args:
        native: use the native kernel; None = where it is available, the device is a CPU and
            the compute dtype is bf16 (the kernel rounds activations to bf16, which an fp32
            model must not). True raises RuntimeError where it cannot be used.
    """

    def __init__(
        self,
        weight: Int8GroupWeight,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        native: bool | None = None,
    ) -> None:
        super().__init__()
        self.out_features = weight.out_features
        self.in_features = weight.in_features
        self.group_size = weight.group_size
        device = torch.device(device)
        self.bias: torch.Tensor | None
        self.register_buffer("bias", None if bias is None else bias.to(device, dtype))
        self.native: Int8Packed | None = None
        if self._use_native(native, dtype, device):
            self.native = int8_native.pack(weight)
        if self.native is not None:
            # The packed tensors are buffers (state_dict, memory accounting); the dataclass
            # holds the same tensors for the kernel call.
            self.qweight: torch.Tensor
            self.scales_and_zeros: torch.Tensor
            self.row_scale: torch.Tensor
            self.register_buffer("qweight", self.native.qweight)
            self.register_buffer("scales_and_zeros", self.native.scales)
            self.register_buffer("row_scale", self.native.row_scale)
        else:
            self.weight: torch.Tensor
            self.register_buffer("weight", weight.dequantize(dtype).to(device))

    def _use_native(self, native: bool | None, dtype: torch.dtype, device: torch.device) -> bool:
        if native is False:
            return False
        if native is None:
            fits = self.group_size % int8_native.BLOCK_K == 0  # else pack() refuses it
            wanted = dtype == torch.bfloat16 and device.type == "cpu" and fits
            return wanted and int8_native.available()
        if device.type != "cpu":
            raise RuntimeError(f"native int8-group kernel requested on {device}: CPU only")
        if not int8_native.available():
            raise RuntimeError(
                f"native int8-group kernel requested but {int8_native.unavailable_reason()}"
            )
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:  # takes [..., K]; fewest ops on the decode path
            y = int8_native.matmul(x, self.native)
            return y if self.bias is None else y + self.bias
        y = F.linear(x, self.weight.to(x.dtype))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        kernel = "native" if self.native is not None else "dequant"
        return (
            f"in={self.in_features}, out={self.out_features}, int8 group={self.group_size}, "
            f"kernel={kernel}"
        )
