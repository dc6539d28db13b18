"""Per-platform settings of a deploy config (pydantic, boundary side).

Each enabled platform becomes one kustomize overlay: ``nvidia`` (vLLM on NVIDIA GPUs),
``neuron`` (vLLM on AWS Trainium/Inferentia), ``specserve`` (specserve's own server image,
CPU and/or CUDA variants).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specserve import __version__
from specserve.deploy.catalog import NEURON_INSTANCES

# DNS-1035 label; with a length cap it leaves room for suffixes within 63 characters.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# The version at the start of a vLLM image tag: ``v0.23.0``, ``0.11.0-neuronx-...``.
_VERSION_TAG = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?!\d)")


def image_version(image: str) -> tuple[int, int, int] | None:
    """The version a pinned image's tag starts with, or None (digest, ``latest``, other)."""
    if "@" in image:
        return None
    _, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return None
    m = _VERSION_TAG.match(tag)
    if m is None:
        return None
    return int(m[1]), int(m[2]), int(m[3] or 0)


class Strict(BaseModel):
    """Frozen, and unknown keys are errors (a typo in a config must not pass silently)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class NvidiaConfig(Strict):
    """vLLM on NVIDIA GPUs."""

    image: str = Field(default="vllm/vllm-openai:v0.23.0", description="Pinned vLLM image.")
    gpus: int = Field(default=1, ge=1, le=64, description="nvidia.com/gpu per pod.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="TP degree; must divide gpus.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    node_selector: dict[str, str] = Field(default_factory=dict)

    @property
    def vllm_version(self) -> tuple[int, int, int] | None:
        """vLLM's version read from the image tag (``vllm/vllm-openai:v0.23.0``), or None."""
        return image_version(self.image)


class NeuronConfig(Strict):
    """vLLM on AWS Trainium/Inferentia through the vLLM Neuron plugin (NxD Inference)."""

    image: str = Field(
        default="public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:"
        "0.11.0-neuronx-py312-sdk2.27.0-ubuntu24.04",
        description="Pinned Neuron vLLM deep learning container.",
    )
    instance_type: str = Field(
        default="trn2.48xlarge", description="EC2 instance type of the nodes."
    )
    neuron_devices: int = Field(ge=1, description="aws.amazon.com/neuron devices per pod.")
    tensor_parallel_size: int = Field(ge=1, description="TP degree in logical NeuronCores.")
    fused_speculation: bool = Field(
        default=True, description="Fuse draft and target into one compiled graph (speculative arm)."
    )
    neuron_config_key: Literal["override_neuron_config", "neuron_config"] = Field(
        default="override_neuron_config",
        description="Key of --additional-config holding Neuron overrides: the NxD Inference "
        "based plugin (the pinned 0.11.0 DLC) reads override_neuron_config; the newer "
        "vllm-neuron plugin documents neuron_config (see docs/deploy.md).",
    )
    compile_cache_claim: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="PVC for compiled artifacts; default: emptyDir.",
    )

    @model_validator(mode="after")
    def _check_devices(self) -> NeuronConfig:
        inst = NEURON_INSTANCES.get(self.instance_type)
        if inst is None:
            known = ", ".join(sorted(NEURON_INSTANCES))
            raise ValueError(f"unknown Neuron instance_type {self.instance_type!r}; known: {known}")
        if self.neuron_devices > inst.num_devices:
            raise ValueError(
                f"neuron_devices={self.neuron_devices} exceeds the {inst.num_devices} devices "
                f"of a {self.instance_type}"
            )
        cores = self.neuron_devices * inst.logical_cores_per_device
        if cores % self.tensor_parallel_size != 0:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} does not divide the "
                f"{cores} logical NeuronCores of {self.neuron_devices} device(s) on "
                f"{self.instance_type} ({inst.logical_cores_per_device} per device)"
            )
        return self


class SpecserveConfig(Strict):
    """specserve's own server, built from the Dockerfile in the repository."""

    image_repository: str = Field(
        default="specserve", description="Registry/repository of the image."
    )
    image_tag: str = Field(default=__version__, description="Tag; the variant suffix is appended.")
    cpu: bool = Field(default=True, description="Render the specserve-cpu overlay.")
    cuda: bool = Field(default=True, description="Render the specserve-cuda overlay.")
    cuda_gpus: int = Field(default=1, ge=1, le=8, description="nvidia.com/gpu per pod (cuda).")
    adaptive_k: bool = Field(
        default=False, description="Speculative arm uses --num-speculative-tokens auto."
    )

    def image(self, variant: Literal["cpu", "cuda"]) -> str:
        return f"{self.image_repository}:{self.image_tag}-{variant}"


class PlatformsConfig(Strict):
    nvidia: NvidiaConfig | None = None
    neuron: NeuronConfig | None = None
    specserve: SpecserveConfig | None = None
