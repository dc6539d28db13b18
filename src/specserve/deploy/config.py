"""The deploy config: one validated description of an A/B deployment (pydantic, boundary side).

Terms:
    arm: one of the two otherwise identical servers, ``baseline`` (no speculation) and
        ``speculative`` (``--speculative-config``). Both serve the same model name.
    platform: where an arm runs; each enabled platform becomes one kustomize overlay:
        ``nvidia`` (vLLM on NVIDIA GPUs), ``neuron`` (vLLM on AWS Trainium/Inferentia),
        ``specserve-cpu`` / ``specserve-cuda`` (specserve's own server image).
    model source: the volume that holds the weights, mounted read-only at ``/models`` in
        every server pod: an existing PersistentVolumeClaim, or an S3 bucket through the
        Mountpoint for Amazon S3 CSI driver.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from specserve.deploy.catalog import tokenizer_family
from specserve.deploy.platforms import (
    NAME_PATTERN,
    PlatformsConfig,
    Strict,
)
from specserve.yaml_config import load_yaml_model

logger = logging.getLogger(__name__)

_MAX_K = 16  # the reference study swept k = 5..15; Neuron compiles one graph per k

MODELS_MOUNT = "/models"


class ModelRef(Strict):
    """A model served (target) or used for drafting (draft)."""

    name: str = Field(min_length=1, description="Served model name / HF repo id.")
    path: str | None = Field(
        default=None, description="Weights folder inside the model volume; default: the name."
    )
    tokenizer_family: str | None = Field(
        default=None, description="Override the tokenizer family looked up from the name."
    )

    @property
    def mount_path(self) -> str:
        """Where the weights appear inside a server container."""
        return f"{MODELS_MOUNT}/{(self.path or self.name).strip('/')}"

    @property
    def family(self) -> str | None:
        return self.tokenizer_family or tokenizer_family(self.name)


class PvcSource(Strict):
    """Weights on an existing PersistentVolumeClaim (ReadOnlyMany or on one node)."""

    kind: Literal["pvc"] = "pvc"
    claim_name: str = Field(pattern=NAME_PATTERN, max_length=63, description="Existing claim.")


class S3Source(Strict):
    """Weights in S3, mounted by the Mountpoint for Amazon S3 CSI driver (s3.csi.aws.com)."""

    kind: Literal["s3"] = "s3"
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", description="Bucket.")
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$", description="e.g. us-west-2.")
    prefix: str = Field(default="", description="Key prefix mounted as the volume root.")
    capacity: str = Field(default="1200Gi", description="Nominal PV size (S3 is not size-limited).")


ModelSource = Annotated[PvcSource | S3Source, Field(discriminator="kind")]


class SpeculationConfig(Strict):
    """What the speculative arm adds to the baseline."""

    method: Literal["draft_model", "eagle", "eagle3", "ngram"] = Field(
        default="draft_model", description="vLLM speculative method."
    )
    num_speculative_tokens: int = Field(description=f"k, draft tokens per step (1..{_MAX_K}).")
    draft_max_model_len: int | None = Field(
        default=None, ge=16, description="Draft context length."
    )
    prompt_lookup_max: int = Field(
        default=4, ge=1, le=16, description="ngram: longest n-gram matched."
    )

    @model_validator(mode="after")
    def _check_k(self) -> SpeculationConfig:
        if not 1 <= self.num_speculative_tokens <= _MAX_K:
            raise ValueError(
                f"num_speculative_tokens must be in 1..{_MAX_K}, got "
                f"{self.num_speculative_tokens} (the reference study swept 5..15)"
            )
        return self


class ServingConfig(Strict):
    """Server settings shared by both arms on every platform."""

    max_model_len: int = Field(ge=16, description="Context length (prompt + output).")
    max_num_seqs: int = Field(ge=1, le=4096, description="Concurrent sequences per server.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    port: int = Field(default=8000, ge=1024, le=65535, description="Container port.")
    replicas: int = Field(default=1, ge=1, le=64, description="Pods per arm.")
    cpu: str = Field(default="4", description="CPU request of a server pod.")
    memory: str = Field(default="32Gi", description="Memory request (and limit) of a server pod.")
    shm_size: str = Field(default="16Gi", description="Size of /dev/shm (tensor-parallel workers).")
    startup_timeout_s: int = Field(
        default=3600, ge=60, description="Startup probe budget (Neuron compiles at first start)."
    )


class EmfConfig(Strict):
    """The bench's CloudWatch embedded-metric-format lines, printed to the Job's log."""

    namespace: str = Field(
        default="specserve/bench", min_length=1, description="CloudWatch namespace."
    )


class BenchJobConfig(Strict):
    """The benchmark Job that drives both arms, alternating between them."""

    enabled: bool = True
    endpoint: Literal["chat", "completions"] = "chat"
    suites: tuple[str, ...] = Field(default=("structured", "open-ended"), min_length=1)
    concurrency: int = Field(default=1, ge=1, le=4096)
    num_requests: int = Field(default=100, ge=1)
    max_tokens: int = Field(default=256, ge=1)
    warmup_requests: int = Field(default=2, ge=0, description="Per arm, excluded from results.")
    results_storage: str = Field(default="10Gi", description="Size of the results PVC.")
    results_storage_class: str | None = Field(default=None, description="Default class when unset.")
    cloudwatch_emf: EmfConfig | None = Field(default=None, description="Emit EMF logs when set.")


class MonitoringConfig(Strict):
    service_monitor: bool = Field(
        default=True, description="Render a monitoring.coreos.com ServiceMonitor."
    )
    prometheus_annotations: bool = Field(
        default=True, description="prometheus.io/* pod annotations."
    )
    scrape_interval: str = Field(default="15s", pattern=r"^\d+(ms|s|m)$")
    grafana_dashboard: bool = Field(
        default=True, description="Dashboard ConfigMap (grafana sidecar)."
    )


class DeployConfig(Strict):
    """Everything ``specserve deploy render`` needs."""

    name: str = Field(pattern=NAME_PATTERN, max_length=40, description="Prefix of resource names.")
    namespace: str = Field(default="specserve-ab", pattern=NAME_PATTERN, max_length=63)
    target: ModelRef
    draft: ModelRef | None = None
    model_source: ModelSource | None = Field(
        default=None, description="Where the weights are (required)."
    )
    speculation: SpeculationConfig
    serving: ServingConfig
    platforms: PlatformsConfig
    bench: BenchJobConfig = Field(default_factory=BenchJobConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)

    @model_validator(mode="after")
    def _check(self) -> DeployConfig:
        if self.model_source is None:
            raise ValueError(
                "model_source is missing: give {kind: pvc, claim_name: ...} or "
                "{kind: s3, bucket: ..., region: ...} so the servers can find the weights"
            )
        method = self.speculation.method
        if method == "ngram":
            if self.draft is not None:
                raise ValueError("speculation.method 'ngram' takes no draft model; remove draft")
        elif self.draft is None:
            raise ValueError(f"speculation.method {method!r} needs a draft model (draft.name)")
        elif method == "draft_model":
            self._check_tokenizers(self.target, self.draft)
        p = self.platforms
        if p.nvidia is None and p.neuron is None and p.specserve is None:
            raise ValueError("platforms: enable at least one of nvidia, neuron, specserve")
        if p.nvidia is not None and p.nvidia.gpus % p.nvidia.tensor_parallel_size != 0:
            raise ValueError(
                f"platforms.nvidia.tensor_parallel_size={p.nvidia.tensor_parallel_size} does "
                f"not divide gpus={p.nvidia.gpus}"
            )
        if p.specserve is not None:
            if method in ("eagle", "eagle3"):
                raise ValueError(f"specserve's server has no {method!r} proposer; use draft_model")
            if not (p.specserve.cpu or p.specserve.cuda):
                raise ValueError("platforms.specserve: enable cpu or cuda (or remove it)")
        return self

    @staticmethod
    def _check_tokenizers(target: ModelRef, draft: ModelRef) -> None:
        t_family, d_family = target.family, draft.family
        if t_family is None or d_family is None:
            unknown = target.name if t_family is None else draft.name
            logger.warning(
                "tokenizer family of %s is unknown; cannot check that draft and target share "
                "a tokenizer (set tokenizer_family to check)",
                unknown,
            )
        elif t_family != d_family:
            raise ValueError(
                f"draft {draft.name!r} (tokenizer family {d_family}) and target {target.name!r} "
                f"(family {t_family}) use different tokenizers; a draft must share the "
                "target's tokenizer"
            )

    @property
    def overlays(self) -> tuple[str, ...]:
        """Names of the overlays this config renders, in a fixed order."""
        p = self.platforms
        names = []
        if p.nvidia is not None:
            names.append("nvidia")
        if p.neuron is not None:
            names.append("neuron")
        if p.specserve is not None:
            names += ["specserve-cpu"] if p.specserve.cpu else []
            names += ["specserve-cuda"] if p.specserve.cuda else []
        return tuple(names)


class DeployConfigError(ValueError):
    """A deploy config that cannot be read or is invalid; the message lists every problem."""


def load_deploy_config(path: str | Path) -> DeployConfig:
    """Read and validate a YAML deploy config.

    Raises:
        DeployConfigError: missing file, YAML syntax error, or invalid content.
    """
    return load_yaml_model(path, DeployConfig, DeployConfigError, "deploy config")
