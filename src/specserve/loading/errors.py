"""Errors raised while finding, fetching or loading a model. Each message names the problem
and, where there is one, the way out (another path, a catalog name, a smaller model)."""

from __future__ import annotations

from specserve.models.arch import UnsupportedModelError

__all__ = [
    "CorruptModelError",
    "HubUnavailableError",
    "InsufficientMemoryError",
    "ModelNotFoundError",
    "UnsupportedModelError",
]


class ModelNotFoundError(FileNotFoundError):
    """The model spec names no catalog entry, no existing path and no reachable repository."""


class CorruptModelError(ValueError):
    """A model file exists but cannot be parsed (truncated, wrong magic, inconsistent shapes)."""


class InsufficientMemoryError(MemoryError):
    """The model's weights would not fit in the memory available on the target device."""


class HubUnavailableError(ConnectionError):
    """A Hugging Face repo id was given but the hub cannot be reached."""
