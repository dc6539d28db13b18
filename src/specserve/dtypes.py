"""Compute dtypes by name, the one map from ``--dtype`` / config strings to torch dtypes."""

from __future__ import annotations

import torch

from specserve.config import DType

DTYPES: dict[DType, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (ValueError naming the known ones otherwise)."""
    try:
        return DTYPES[name]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


# Weight formats stored as plain floats (``--weights fp32|bf16``) and their dtypes.
FLOAT_WEIGHT_FORMATS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
