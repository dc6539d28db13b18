"""Where fetched models and dequantised weights live on disk.

``$SPECSERVE_CACHE_DIR`` (default ``~/.cache/specserve``) holds:

- ``models/<official file name>``: GGUF files fetched by the catalog (verified sha256).
- ``weights/<key>/``: dequantised weights of a GGUF file as safetensors plus the architecture,
  tokenizer and chat template, so a second load skips dequantisation (``weight_cache.py``).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache directory (created on first use)."""
    env = os.environ.get("SPECSERVE_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "specserve"
    root.mkdir(parents=True, exist_ok=True)
    return root


def models_dir() -> Path:
    path = cache_root() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def weights_dir() -> Path:
    path = cache_root() / "weights"
    path.mkdir(parents=True, exist_ok=True)
    return path
