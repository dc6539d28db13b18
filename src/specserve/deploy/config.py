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

SpecMethod = Literal["draft_model", "eagle", "eagle3", "medusa", "ngram"]
# Methods whose ``draft`` is a trained head over the target's hidden states, not a model.
HEAD_METHODS: tuple[SpecMethod, ...] = ("eagle", "eagle3", "medusa")
# vLLM 0.28's Medusa loader is the newest one checked; vLLM 0.33 no longer has Medusa.
# Versions after 0.28 are refused (the release that dropped it is not pinned down).
MEDUSA_LAST_VLLM = (0, 28)
MEDUSA_GONE_VLLM = (0, 33)


class ModelRef(Strict):
    """A model served (target) or used for drafting (draft)."""

    name: str = Field(min_length=1, description="Served model name / HF repo id.")
    path: str | None = Field(
        default=None, description="Weights folder inside the model volume; default: the name."
    )
    tokenizer_family: str | None = Field(
        default=None, description="Override the tokenizer family looked up from the name."
    )
    from_hub: bool = Field(
        default=False,
        description="Draft only: the server downloads `name` from the Hugging Face Hub at "
        "start-up instead of reading the model volume (e.g. a public EAGLE-3 head).",
    )

    @model_validator(mode="after")
    def _check_hub(self) -> ModelRef:
        if self.from_hub and self.path is not None:
            raise ValueError(
                f"{self.name!r}: from_hub downloads the name from the Hugging Face Hub; "
                "remove path (or from_hub to read the folder from the model volume)"
            )
        return self

    @property
    def mount_path(self) -> str:
        """Where the weights appear inside a server container."""
        return f"{MODELS_MOUNT}/{(self.path or self.name).strip('/')}"

    @property
    def location(self) -> str:
        """What a server is given: the hub id (``from_hub``) or the folder's mount path."""
        return self.name if self.from_hub else self.mount_path

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

    method: SpecMethod = Field(default="draft_model", description="vLLM speculative method.")
    num_speculative_tokens: int = Field(description=f"k, draft tokens per step (1..{_MAX_K}).")
    num_heads: int | None = Field(
        default=None,
        ge=1,
        description="medusa: heads stored in the head folder; checked against k (vLLM sets "
        "its Medusa head count to num_speculative_tokens).",
    )
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
        if self.num_heads is not None:
            if self.method != "medusa":
                raise ValueError(f"num_heads is for method 'medusa', not {self.method!r}")
            if self.num_heads != self.num_speculative_tokens:
                raise ValueError(
                    f"medusa: num_speculative_tokens={self.num_speculative_tokens} must equal "
                    f"num_heads={self.num_heads} (vLLM runs as many Medusa heads as "
                    "num_speculative_tokens, so a different k drops trained heads or asks for "
                    "heads that do not exist)"
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
        if self.target.from_hub:
            raise ValueError("target.from_hub: the target is always read from the model volume")
        if method == "ngram":
            if self.draft is not None:
                raise ValueError("speculation.method 'ngram' takes no draft model; remove draft")
        elif self.draft is None:
            if method in HEAD_METHODS:
                raise ValueError(
                    f"speculation.method {method!r} needs a head (draft): draft.path, its "
                    "folder in the model volume (e.g. written by `specserve train-draft`), "
                    "or draft.name with from_hub: true for a public head"
                )
            raise ValueError(f"speculation.method {method!r} needs a draft model (draft.name)")
        elif method == "draft_model":
            self._check_tokenizers(self.target, self.draft)
        p = self.platforms
        if p.nvidia is None and p.neuron is None and p.specserve is None:
            raise ValueError("platforms: enable at least one of nvidia, neuron, specserve")
        if p.nvidia is not None:
            if p.nvidia.gpus % p.nvidia.tensor_parallel_size != 0:
                raise ValueError(
                    f"platforms.nvidia.tensor_parallel_size={p.nvidia.tensor_parallel_size} "
                    f"does not divide gpus={p.nvidia.gpus}"
                )
            version = p.nvidia.vllm_version
            if method == "medusa" and version is not None and version[:2] > MEDUSA_LAST_VLLM:
                gone = ".".join(map(str, MEDUSA_GONE_VLLM))
                last = ".".join(map(str, MEDUSA_LAST_VLLM))
                raise ValueError(
                    f"platforms.nvidia.image {p.nvidia.image!r} is vLLM "
                    f"{'.'.join(map(str, version))}: Medusa is checked up to vLLM {last} and "
                    f"removed by {gone}; pin an image of vLLM <= {last} for method 'medusa'"
                )
        if p.neuron is not None:
            if method in HEAD_METHODS and self.draft is not None and self.draft.from_hub:
                raise ValueError(
                    "platforms.neuron: a hub head (draft.from_hub) is not rendered for Neuron; "
                    "copy the head into the model volume and set draft.path"
                )
            if method in ("eagle", "eagle3") and not p.neuron.fused_speculation:
                raise ValueError(
                    f"platforms.neuron: method {method!r} runs as fused speculation on Neuron "
                    "(NxD Inference's enable_eagle_speculation turns enable_fused_speculation "
                    "on); set fused_speculation: true"
                )
        if p.specserve is not None and not (p.specserve.cpu or p.specserve.cuda):
            raise ValueError("platforms.specserve: enable cpu or cuda (or remove it)")
        return self

    def notes(self) -> dict[str, list[str]]:
        """Caveats of a valid config, by overlay name: printed by ``deploy render`` and
        written at the top of that overlay's speculative patch."""
        out: dict[str, list[str]] = {}
        method = self.speculation.method
        p = self.platforms
        if method == "medusa" and p.nvidia is not None and p.nvidia.vllm_version is None:
            out.setdefault("nvidia", []).append(
                f"cannot read a vLLM version from image {p.nvidia.image!r}; Medusa needs "
                "vLLM <= 0.28 (gone by 0.33)"
            )
        if method == "medusa" and p.neuron is not None:
            target = self.target.mount_path
            out.setdefault("neuron", []).append(
                f"NxD Inference loads Medusa heads from {target}/medusa_heads.pt (a torch "
                "state dict of medusa_head_<i> modules), not from draft.path; convert "
                "specserve's vLLM-format Medusa folder and put that file in the target's folder"
            )
            out["neuron"].append(
                "Medusa through the vLLM Neuron plugin is unverified (the plugin documents "
                "EAGLE); medusa_tree is not rendered, so the heads propose one chain"
            )
        if method == "eagle" and p.specserve is not None:
            for overlay in self.overlays:
                if overlay.startswith("specserve-"):
                    out.setdefault(overlay, []).append(
                        "specserve's eagle proposer reads EAGLE-3 heads (the speculators "
                        "format); an EAGLE-1 head does not load there"
                    )
        if method == "eagle3" and p.neuron is not None:
            out.setdefault("neuron", []).append(
                "EAGLE-3 through the vLLM Neuron plugin is unverified (the plugin release read "
                "documents EAGLE v1 only); is_eagle3 is NxD Inference's flag for it"
            )
        if self.draft is not None and self.draft.from_hub:
            for overlay in self.overlays:
                out.setdefault(overlay, []).append(
                    f"the speculative arm downloads {self.draft.name!r} from the Hugging Face "
                    "Hub at start-up (HF_HUB_OFFLINE=0 in both arms)"
                )
        return out

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
