"""The quantised-weight cache: a second load reads the cached tensors and builds the same
model (SmolLM2-135M; skipped only when the model cannot be fetched)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading.quant_cache import compute_dtype_for, load_model_with_weights
from specserve.models.quant.layers import Int8Embedding, Int8Linear


def test_compute_dtype_rules() -> None:
    assert compute_dtype_for("int4", None) == torch.bfloat16
    assert compute_dtype_for("int8", torch.float32) == torch.float32
    assert compute_dtype_for("fp32", None) == torch.float32
    with pytest.raises(ValueError, match="runs in"):
        compute_dtype_for("bf16", torch.float32)


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown weight format"):
        load_model_with_weights("smollm2-135m-instruct", "int3")  # type: ignore[arg-type]


def test_second_load_reads_the_cache(tmp_path: Path) -> None:
    loading = pytest.importorskip("specserve.loading")
    try:
        loading.load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
    except Exception as e:  # no cached model and no package index: nothing to test against
        pytest.skip(f"SmolLM2-135M not available: {e}")
    first = load_model_with_weights("smollm2-135m-instruct", "int8", cache_dir=tmp_path)
    files = list(tmp_path.glob("*.int8.safetensors"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    second = load_model_with_weights("smollm2-135m-instruct", "int8", cache_dir=tmp_path)
    assert files[0].stat().st_mtime_ns == mtime  # read, not rewritten
    for lm in (first, second):
        assert isinstance(lm.model.model.embed_tokens, Int8Embedding)
        assert isinstance(lm.model.get_submodule("model.layers.0.mlp.down_proj"), Int8Linear)
        assert lm.model.dtype == torch.bfloat16
    ids = lm.tokenizer.encode("def fib(n):", add_special_tokens=False)
    h1 = SingleSequenceCache(first.model, 32).forward(ids)
    h2 = SingleSequenceCache(second.model, 32).forward(ids)
    assert torch.equal(first.model.compute_logits(h1), second.model.compute_logits(h2))
