"""Model loading: catalog names, GGUF files (dequantised, cached), HF directories, repo ids.

``load_model(spec, dtype, device)`` is the entry point; see ``loader.py``.
"""

from specserve.loading.catalog import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET, CatalogEntry
from specserve.loading.errors import (
    CorruptModelError,
    HubUnavailableError,
    InsufficientMemoryError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from specserve.loading.loader import LoadedModel, load_model, load_tokenizer
from specserve.loading.tokenizer import Tokenizer
from specserve.loading.transport import TransportError

__all__ = [
    "CATALOG",
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "CatalogEntry",
    "CorruptModelError",
    "HubUnavailableError",
    "InsufficientMemoryError",
    "LoadedModel",
    "ModelNotFoundError",
    "Tokenizer",
    "TransportError",
    "UnsupportedModelError",
    "load_model",
    "load_tokenizer",
]
