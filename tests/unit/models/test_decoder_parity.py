"""Our decoder's logits equal transformers' for the same config and weights (fp32)."""

from __future__ import annotations

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.arch import ArchConfig
from specserve.models.decoder import DecoderLM

transformers = pytest.importorskip("transformers")

HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def _hf_pair(family: str, seed: int) -> tuple[torch.nn.Module, DecoderLM]:
    cfg_name, model_name = HF_CLASSES[family]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_name)(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rope_theta=5000.0 if family == "llama" else 10000.0,
        tie_word_embeddings=family != "llama",
    )
    hf = getattr(transformers, model_name)(cfg).eval()
    d = cfg.to_dict()
    d["architectures"] = [model_name]
    ours = DecoderLM(ArchConfig.from_hf_config(d)).eval()
    result = ours.load_state_dict(hf.state_dict(), strict=False)
    assert not result.missing_keys, result.missing_keys
    return hf, ours


@pytest.mark.parametrize("seed", [0, 1])
def test_prefill_then_decode_matches_transformers(family: str, seed: int) -> None:
    hf, ours = _hf_pair(family, seed)
    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    cache = SingleSequenceCache(ours, 64)
    hidden = [cache.forward(ids[0, :11])]
    hidden += [cache.forward(ids[0, i : i + 1]) for i in range(11, 20)]
    logits = ours.compute_logits(torch.cat(hidden))
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)


def test_rollback_recomputes_identical_logits(family: str) -> None:
    _, ours = _hf_pair(family, 3)
    ids = list(range(5, 25))
    cache = SingleSequenceCache(ours, 64)
    first = ours.compute_logits(cache.forward(ids))
    cache.truncate(12)
    again = ours.compute_logits(cache.forward(ids[12:]))
    torch.testing.assert_close(again, first[12:], rtol=1e-5, atol=1e-5)
