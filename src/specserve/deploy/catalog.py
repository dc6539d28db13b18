"""Facts the deploy config is checked against: tokenizer families and accelerator instances.

Terms:
    tokenizer family: a set of models known to share one tokenizer (same vocabulary, same ids),
        so any member can draft for any other. A draft model must share the target's tokenizer;
        the family table makes that checkable for the models we know. Models not in the table
        are *unknown*, and the check is skipped for them (it cannot be known offline).
    Neuron device: one Trainium/Inferentia chip, the unit of the ``aws.amazon.com/neuron``
        Kubernetes resource. A chip exposes several *logical NeuronCores*; vLLM's tensor
        parallel degree counts logical NeuronCores.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# (family, pattern) in order; the first full match wins. Patterns are matched case-insensitively
# against the model name with any "org/" prefix removed and against specserve catalog names.
# Qwen2.5 and Qwen3 are different families: Qwen3 adds special tokens (<think>, ...), so ids
# past the shared BPE range differ.
_TOKENIZER_FAMILIES: tuple[tuple[str, str], ...] = (
    # Dense and MoE Qwen3 models share one tokenizer.
    ("qwen3", r"qwen3-(0\.6b|1\.7b|4b|8b|14b|32b|30b-a3b|235b-a22b)(-[a-z0-9.-]+)?"),
    ("qwen2.5", r"qwen2\.5-(coder-)?(0\.5|1\.5|3|7|14|32|72)b(-instruct)?(-gguf|-awq)?"),
    ("llama3", r"(meta-)?llama-3\.[123]-\d+b(-instruct)?"),
    ("llama2", r"llama-2-\d+b(-chat)?(-hf)?"),
    ("smollm2", r"smollm2-(135m|360m|1\.7b)(-instruct)?"),
    ("gemma3", r"gemma-3-(270m|1b|4b|12b|27b)(-it|-pt)?"),
)


def tokenizer_family(model_name: str) -> str | None:
    """The tokenizer family of ``model_name``, or None when the model is not in the table.

    >>> tokenizer_family("Qwen/Qwen3-32B")
    'qwen3'
    >>> tokenizer_family("qwen2.5-coder-0.5b-instruct")
    'qwen2.5'
    >>> tokenizer_family("my-org/custom-model") is None
    True
    """
    short = model_name.rstrip("/").rsplit("/", 1)[-1].lower()
    for family, pattern in _TOKENIZER_FAMILIES:
        if re.fullmatch(pattern, short):
            return family
    return None


@dataclass(frozen=True)
class NeuronInstance:
    """One EC2 instance type with Neuron devices.

    Attributes:
        num_devices: Neuron devices (chips) on the instance.
        logical_cores_per_device: logical NeuronCores per device at the default logical
            NeuronCore configuration (Trn2: 8 physical cores grouped in pairs, LNC=2 -> 4).
    """

    num_devices: int
    logical_cores_per_device: int

    def __post_init__(self) -> None:
        if self.num_devices < 1 or self.logical_cores_per_device < 1:
            raise ValueError(f"bad NeuronInstance {self}")


NEURON_INSTANCES: dict[str, NeuronInstance] = {
    "trn2.3xlarge": NeuronInstance(num_devices=1, logical_cores_per_device=4),
    "trn2.48xlarge": NeuronInstance(num_devices=16, logical_cores_per_device=4),
    "trn2u.48xlarge": NeuronInstance(num_devices=16, logical_cores_per_device=4),
    "trn1.2xlarge": NeuronInstance(num_devices=1, logical_cores_per_device=2),
    "trn1.32xlarge": NeuronInstance(num_devices=16, logical_cores_per_device=2),
    "trn1n.32xlarge": NeuronInstance(num_devices=16, logical_cores_per_device=2),
    "inf2.xlarge": NeuronInstance(num_devices=1, logical_cores_per_device=2),
    "inf2.8xlarge": NeuronInstance(num_devices=1, logical_cores_per_device=2),
    "inf2.24xlarge": NeuronInstance(num_devices=6, logical_cores_per_device=2),
    "inf2.48xlarge": NeuronInstance(num_devices=12, logical_cores_per_device=2),
}
