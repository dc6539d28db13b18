"""Tokenizer-family and Neuron-instance tables."""

from __future__ import annotations

import pytest

from specserve.deploy.catalog import NEURON_INSTANCES, tokenizer_family


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("Qwen/Qwen3-32B", "qwen3"),
        ("Qwen/Qwen3-1.7B", "qwen3"),
        ("Qwen/Qwen3-0.6B", "qwen3"),
        ("Qwen/Qwen3-30B-A3B", "qwen3"),
        ("Qwen/Qwen3-8B-FP8", "qwen3"),
        ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "qwen2.5"),
        ("qwen2.5-coder-0.5b-instruct", "qwen2.5"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3"),
        ("meta-llama/Llama-3.2-1B", "llama3"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"),
        ("smollm2-135m-instruct", "smollm2"),
        ("google/gemma-3-270m", "gemma3"),
        ("my-org/custom-model", None),
        ("Qwen/Qwen3-VL-8B-Instruct", None),  # vision variant: not claimed
    ],
)
def test_tokenizer_family(name: str, family: str | None) -> None:
    assert tokenizer_family(name) == family


def test_reference_instance() -> None:
    trn2 = NEURON_INSTANCES["trn2.48xlarge"]
    # The reference study's TP 32 fits in half the instance (8 of 16 devices).
    assert trn2.num_devices == 16
    assert 8 * trn2.logical_cores_per_device == 32
