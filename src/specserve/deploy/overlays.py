"""Kustomize overlays, one per platform: strategic-merge patches of the two arm Deployments.

A patch names the container ``server`` (the merge key), so image, command, arguments,
resources, environment and volumes of the base are replaced or extended per platform:

* ``nvidia``: the pinned vLLM image, ``nvidia.com/gpu``, tensor (and pipeline) parallelism.
* ``neuron``: the Neuron vLLM container, ``aws.amazon.com/neuron`` devices on the chosen
  instance type, tensor parallelism in logical NeuronCores, and for the speculative arm
  NxD Inference's speculation flags (``--additional-config`` with ``override_neuron_config``):
  fused speculation, EAGLE (``enable_eagle_speculation``, ``is_eagle3``) or Medusa
  (``is_medusa``, ``medusa_speculation_length``, ``num_medusa_heads``; no
  ``--speculative-config``, the heads live in the target's folder as ``medusa_heads.pt``).
* ``specserve-cpu`` / ``specserve-cuda``: specserve's own image and ``specserve serve``
  (``--draft-model``, ``--spec-method ngram|eagle|medusa``).
"""

from __future__ import annotations

import json
from typing import Literal

from specserve.deploy.base import ARMS, SERVER_CONTAINER, Arm, Obj, arm_name, vllm_args
from specserve.deploy.config import DeployConfig
from specserve.deploy.platforms import NeuronConfig, NvidiaConfig, SpecserveConfig

KUSTOMIZE_API = "kustomize.config.k8s.io/v1beta1"
COMPILE_CACHE_MOUNT = "/compile-cache"
SPECSERVE_CACHE_MOUNT = "/cache"


def _gpu_toleration() -> Obj:
    return {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _patch(cfg: DeployConfig, arm: Arm, container: Obj, pod: Obj | None = None) -> Obj:
    """A strategic-merge patch of one arm's Deployment."""
    pod_spec: Obj = dict(pod or {})
    pod_spec["containers"] = [{"name": SERVER_CONTAINER, **container}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": arm_name(cfg, arm)},
        "spec": {"template": {"spec": pod_spec}},
    }


def nvidia_patch(cfg: DeployConfig, spec: NvidiaConfig, arm: Arm) -> Obj:
    args = [
        *vllm_args(cfg, arm),
        f"--tensor-parallel-size={spec.tensor_parallel_size}",
        f"--gpu-memory-utilization={spec.gpu_memory_utilization}",
    ]
    pipeline = spec.gpus // spec.tensor_parallel_size
    if pipeline > 1:  # every requested GPU is used: the rest of the GPUs become pipeline stages
        args.append(f"--pipeline-parallel-size={pipeline}")
    container = {
        "image": spec.image,
        "args": args,
        "resources": {"limits": {"nvidia.com/gpu": spec.gpus}},
    }
    pod: Obj = {"tolerations": [_gpu_toleration()]}
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    return _patch(cfg, arm, container, pod)


def neuron_overrides(cfg: DeployConfig, spec: NeuronConfig) -> Obj:
    """NxD Inference ``NeuronConfig`` fields the speculative arm overrides (may be empty).

    The vLLM Neuron plugin already turns ``enable_fused_speculation`` on (and, for method
    ``eagle``, ``enable_eagle_speculation``) from ``--speculative-config``; they are repeated
    here so the compiled graph does not depend on that mapping. Medusa is no fused draft:
    NxD Inference builds the heads into the target and verifies the heads' tokens plus the
    last accepted one per step (``medusa_speculation_length`` = heads + 1 for one chain).
    """
    method = cfg.speculation.method
    k = cfg.speculation.num_speculative_tokens
    if method == "medusa":
        # k is the head count (DeployConfig checks num_heads == k when num_heads is given).
        return {"is_medusa": True, "medusa_speculation_length": k + 1, "num_medusa_heads": k}
    if not spec.fused_speculation:
        return {}
    overrides: Obj = {"enable_fused_speculation": True}
    if method in ("eagle", "eagle3"):
        overrides["enable_eagle_speculation"] = True
    if method == "eagle3":
        overrides["is_eagle3"] = True
    return overrides


def neuron_additional_config(cfg: DeployConfig, spec: NeuronConfig) -> str | None:
    """The speculative arm's ``--additional-config`` JSON, or None when nothing to override."""
    overrides = neuron_overrides(cfg, spec)
    if not overrides:
        return None
    return json.dumps({spec.neuron_config_key: overrides}, separators=(", ", ": "))


def neuron_patch(cfg: DeployConfig, spec: NeuronConfig, arm: Arm) -> Obj:
    # Medusa on Neuron has no draft model for vLLM to load: only the NxD Inference flags.
    with_spec = cfg.speculation.method != "medusa"
    args = [*vllm_args(cfg, arm, with_spec), f"--tensor-parallel-size={spec.tensor_parallel_size}"]
    extra = neuron_additional_config(cfg, spec)
    if arm == "speculative" and extra is not None:
        args.append(f"--additional-config={extra}")
    container = {
        "image": spec.image,
        "args": args,
        "env": [
            {"name": "VLLM_NEURON_FRAMEWORK", "value": "neuronx-distributed-inference"},
            # Compiled graphs differ between the arms: one folder each, reused on restart.
            {"name": "NEURON_COMPILED_ARTIFACTS", "value": f"{COMPILE_CACHE_MOUNT}/{arm}"},
        ],
        "resources": {"limits": {"aws.amazon.com/neuron": spec.neuron_devices}},
        "volumeMounts": [{"name": "compile-cache", "mountPath": COMPILE_CACHE_MOUNT}],
    }
    cache: Obj = (
        {"persistentVolumeClaim": {"claimName": spec.compile_cache_claim}}
        if spec.compile_cache_claim is not None
        else {"emptyDir": {}}
    )
    pod = {
        "nodeSelector": {"node.kubernetes.io/instance-type": spec.instance_type},
        "tolerations": [
            {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}
        ],
        "volumes": [{"name": "compile-cache", **cache}],
    }
    return _patch(cfg, arm, container, pod)


def specserve_serve_args(
    cfg: DeployConfig, spec: SpecserveConfig, arm: Arm, variant: Literal["cpu", "cuda"]
) -> list[str]:
    """Arguments after ``specserve`` for one arm of specserve's own server."""
    s = cfg.serving
    args = [
        "serve",
        f"--model={cfg.target.mount_path}",
        f"--served-model-name={cfg.target.name}",
        "--host=0.0.0.0",
        f"--port={s.port}",
        f"--device={variant}",
        f"--max-model-len={s.max_model_len}",
        f"--max-num-seqs={s.max_num_seqs}",
    ]
    if s.dtype != "auto":
        args.append(f"--dtype={s.dtype}")
    if arm == "baseline":
        return [*args, "--spec-method=none"]
    k = cfg.speculation.num_speculative_tokens
    # Adaptive: the controller picks k per request, at most the configured k.
    k_args = (
        ["--num-speculative-tokens=auto", f"--k-max={k}"]
        if spec.adaptive_k
        else [f"--num-speculative-tokens={k}"]
    )
    method = cfg.speculation.method
    if method == "ngram":
        args.append("--spec-method=ngram")
    else:
        assert cfg.draft is not None
        if method != "draft_model":
            # specserve's EAGLE proposer reads EAGLE-3 heads (the speculators format).
            args.append(f"--spec-method={'medusa' if method == 'medusa' else 'eagle'}")
        args.append(f"--draft-model={cfg.draft.location}")
    return [*args, *k_args]


def specserve_patch(
    cfg: DeployConfig, spec: SpecserveConfig, arm: Arm, variant: Literal["cpu", "cuda"]
) -> Obj:
    container: Obj = {
        "image": spec.image(variant),
        "command": ["specserve"],
        "args": specserve_serve_args(cfg, spec, arm, variant),
        "env": [{"name": "SPECSERVE_CACHE_DIR", "value": SPECSERVE_CACHE_MOUNT}],
        "volumeMounts": [{"name": "specserve-cache", "mountPath": SPECSERVE_CACHE_MOUNT}],
    }
    pod: Obj = {"volumes": [{"name": "specserve-cache", "emptyDir": {}}]}
    if variant == "cuda":
        container["resources"] = {"limits": {"nvidia.com/gpu": spec.cuda_gpus}}
        pod["tolerations"] = [_gpu_toleration()]
    return _patch(cfg, arm, container, pod)


def overlay_patches(cfg: DeployConfig, overlay: str) -> dict[Arm, Obj]:
    """The per-arm patches of one overlay (names from ``DeployConfig.overlays``)."""
    p = cfg.platforms
    patches: dict[Arm, Obj] = {}
    for arm in ARMS:
        if overlay == "nvidia" and p.nvidia is not None:
            patches[arm] = nvidia_patch(cfg, p.nvidia, arm)
        elif overlay == "neuron" and p.neuron is not None:
            patches[arm] = neuron_patch(cfg, p.neuron, arm)
        elif overlay in ("specserve-cpu", "specserve-cuda") and p.specserve is not None:
            variant: Literal["cpu", "cuda"] = "cpu" if overlay == "specserve-cpu" else "cuda"
            patches[arm] = specserve_patch(cfg, p.specserve, arm, variant)
        else:
            raise ValueError(f"overlay {overlay!r} is not enabled in this config")
    return patches


def overlay_kustomization(patch_files: list[str]) -> Obj:
    return {
        "apiVersion": KUSTOMIZE_API,
        "kind": "Kustomization",
        "resources": ["../../base"],
        "patches": [{"path": f} for f in patch_files],
    }
