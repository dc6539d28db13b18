"""Kustomize overlays, one per platform: strategic-merge patches of the two arm Deployments.

A patch names the container ``server`` (the merge key), so image, command, arguments,
resources, environment and volumes of the base are replaced or extended per platform:

* ``nvidia``: the pinned vLLM image, ``nvidia.com/gpu``, tensor (and pipeline) parallelism.
* ``neuron``: the Neuron vLLM container, ``aws.amazon.com/neuron`` devices on the chosen
  instance type, tensor parallelism in logical NeuronCores, and for the speculative arm
  the fused-speculation override (``--additional-config`` with ``override_neuron_config``).
* ``specserve-cpu`` / ``specserve-cuda``: specserve's own image and ``specserve serve``.
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


def neuron_additional_config(spec: NeuronConfig) -> str | None:
    """The speculative arm's ``--additional-config`` JSON, or None when nothing to override."""
    if not spec.fused_speculation:
        return None
    value = {spec.neuron_config_key: {"enable_fused_speculation": True}}
    return json.dumps(value, separators=(", ", ": "))


def neuron_patch(cfg: DeployConfig, spec: NeuronConfig, arm: Arm) -> Obj:
    args = [*vllm_args(cfg, arm), f"--tensor-parallel-size={spec.tensor_parallel_size}"]
    extra = neuron_additional_config(spec)
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
    if cfg.speculation.method == "ngram":
        args.append("--spec-method=ngram")
    else:
        assert cfg.draft is not None and cfg.speculation.method == "draft_model"
        args.append(f"--draft-model={cfg.draft.mount_path}")
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
