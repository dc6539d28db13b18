"""GGUF files written from tiny HF models load into weights and logits equal to transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading import (
    CorruptModelError,
    InsufficientMemoryError,
    ModelNotFoundError,
    UnsupportedModelError,
    load_model,
    weight_cache,
)
from specserve.loading.gguf_loader import GGUFFile

transformers = pytest.importorskip("transformers")

CASES = [
    ("llama", Q.F32),
    ("llama", Q.Q8_0),
    ("llama", Q.Q4_1),
    ("qwen2", Q.F16),
    ("qwen2", Q.Q5_0),
    ("qwen2", Q.Q8_0),
    ("qwen3", Q.BF16),
    ("qwen3", Q.Q4_0),
    ("qwen3", Q.Q5_1),
]


def _ours_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    cache = SingleSequenceCache(model, 64)  # type: ignore[arg-type]
    return model.compute_logits(cache.forward(ids))  # type: ignore[operator]


@pytest.mark.parametrize(("family", "qtype"), CASES, ids=[f"{f}-{q.name}" for f, q in CASES])
def test_logits_match_transformers_loading_the_same_gguf(gguf_factory, family, qtype) -> None:
    path, _ = gguf_factory(family, qtype)
    ours = load_model(path)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = [5, 77, 260, 3, 199, 42, 100, 7, 8, 250, 11]
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(_ours_logits(ours.model, ids), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_f32_weights_equal_the_source_checkpoint(gguf_factory, family) -> None:
    """Names map back and llama's q/k row permutation is undone exactly."""
    path, hf = gguf_factory(family, Q.F32)
    ours = load_model(path).model.state_dict()
    for name, tensor in hf.state_dict().items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)


def test_arch_from_metadata(gguf_factory) -> None:
    path, hf = gguf_factory("qwen2")
    lm = load_model(path)
    a = lm.arch
    assert (a.family, a.hidden_size, a.intermediate_size, a.num_layers) == ("qwen2", 64, 96, 2)
    assert (a.num_heads, a.num_kv_heads, a.head_dim) == (4, 2, 16)
    assert a.rope_theta == 5000.0 and a.max_position_embeddings == 128
    assert a.tie_word_embeddings and a.attention_bias and not a.qk_norm
    assert a.vocab_size == hf.config.vocab_size == lm.tokenizer.vocab_size
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    tok = lm.tokenizer
    assert a.eos_token_ids == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))


def test_second_load_reads_the_cache_and_bf16_is_the_rounded_fp32(gguf_factory) -> None:
    path, _ = gguf_factory("llama", Q.Q8_0)
    first = load_model(path)
    cache = weight_cache.cache_dir_for(path)
    assert weight_cache.weights_file(cache, torch.float32).is_file()
    second = load_model(path)
    assert second.arch == first.arch
    assert second.tokenizer.encode("the cat <|im_end|>") == first.tokenizer.encode(
        "the cat <|im_end|>"
    )
    assert second.tokenizer.eos_token_ids == first.tokenizer.eos_token_ids
    for (n, a), (_, b) in zip(
        first.model.state_dict().items(), second.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), n
    bf16 = load_model(path, dtype=torch.bfloat16)
    assert bf16.model.dtype == torch.bfloat16
    assert weight_cache.weights_file(cache, torch.bfloat16).is_file()
    again = load_model(path, dtype=torch.bfloat16)  # from the bf16 cache file
    for n, w in first.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[n], w.to(torch.bfloat16)), n


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="neither a catalog name nor an existing path"):
        load_model(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        GGUFFile(tmp_path / "nope.gguf")


@pytest.mark.parametrize("keep_fraction", [0.5, 0.999, 0.01])
def test_truncated_gguf_is_reported_as_corrupt(gguf_factory, keep_fraction: float) -> None:
    path, _ = gguf_factory("qwen2", Q.Q8_0)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    with pytest.raises(CorruptModelError, match=path.name):
        load_model(path)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(CorruptModelError, match="not a readable GGUF"):
        load_model(path)


def test_unsupported_architecture_is_named(gguf_factory) -> None:
    path, _ = gguf_factory("llama", arch_name="gpt2")
    with pytest.raises(UnsupportedModelError, match="'gpt2'"):
        load_model(path)


def test_unsupported_tensor_type_is_named(gguf_factory) -> None:
    path, _ = gguf_factory("qwen2", raw_tensor=("blk.0.ffn_up.weight", Q.IQ2_XXS))
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        load_model(path)


def test_too_large_for_memory_is_refused_before_loading(gguf_factory) -> None:
    # Metadata claiming a model far beyond any machine's memory; the tensors are never read.
    path, _ = gguf_factory(
        "qwen2", metadata_overrides={"block_count": 100_000, "feed_forward_length": 1 << 20}
    )
    with pytest.raises(InsufficientMemoryError, match="GiB"):
        load_model(path)


def test_fresh_bf16_load_equals_rounded_fp32(gguf_factory) -> None:
    path_a, _ = gguf_factory("qwen2", Q.Q8_0, seed=4)
    path_b, _ = gguf_factory("qwen2", Q.Q8_0, seed=4)  # same content, separate cache entry
    bf16 = load_model(path_a, dtype=torch.bfloat16)  # dequantised straight to bf16
    fp32 = load_model(path_b, dtype=torch.float32)
    for n, w in fp32.model.state_dict().items():
        assert torch.equal(bf16.model.state_dict()[n], w.to(torch.bfloat16)), n
