"""The kustomize base: both vLLM arms, their Services, the bench Job, storage and monitoring.

Every object is a plain dict in Kubernetes API shape. The base is platform neutral: the
server containers carry the vLLM arguments every platform shares and no accelerator; each
overlay (``overlays.py``) replaces image, arguments and resources for its platform.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from specserve.deploy.config import MODELS_MOUNT, DeployConfig, S3Source
from specserve.deploy.platforms import NvidiaConfig

Arm = Literal["baseline", "speculative"]
ARMS: tuple[Arm, Arm] = ("baseline", "speculative")
SERVER_CONTAINER = "server"
MANAGED_BY = "specserve"
VLLM_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
RESULTS_MOUNT = "/results"
Obj = dict[str, Any]


def arm_name(cfg: DeployConfig, arm: Arm) -> str:
    """Name of an arm's Deployment and Service."""
    return f"{cfg.name}-{arm}"


def models_claim_name(cfg: DeployConfig) -> str:
    assert cfg.model_source is not None
    if cfg.model_source.kind == "pvc":
        return cfg.model_source.claim_name
    return f"{cfg.name}-models"


def labels(cfg: DeployConfig, component: str, instance: str) -> dict[str, str]:
    """The standard ``app.kubernetes.io/*`` labels of one object."""
    return {
        "app.kubernetes.io/name": "specserve-ab",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": cfg.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def arm_labels(cfg: DeployConfig, arm: Arm) -> dict[str, str]:
    # ``arm`` is what the dashboard groups by (kept by the ServiceMonitor's podTargetLabels and
    # by the usual pod-label map of annotation-based scraping).
    return {**labels(cfg, arm, arm_name(cfg, arm)), "arm": arm}


def selector(cfg: DeployConfig, arm: Arm) -> dict[str, str]:
    return {"app.kubernetes.io/instance": arm_name(cfg, arm)}


def speculative_config(cfg: DeployConfig, draft_path: str | None) -> str:
    """The JSON value of vLLM's ``--speculative-config`` (model, k, method).

    For the head methods (``eagle``, ``eagle3``, ``medusa``) ``model`` is the head: its folder
    in the model volume or, with ``draft.from_hub``, its hub id.
    """
    spec = cfg.speculation
    value: dict[str, Any] = {}
    if spec.method != "ngram":
        value["model"] = draft_path
    value["num_speculative_tokens"] = spec.num_speculative_tokens
    value["method"] = spec.method
    if spec.method == "ngram":
        value["prompt_lookup_max"] = spec.prompt_lookup_max
    if spec.draft_max_model_len is not None:
        value["max_model_len"] = spec.draft_max_model_len
    return json.dumps(value, separators=(", ", ": "))


def vllm_args(cfg: DeployConfig, arm: Arm, speculative_config_arg: bool = True) -> list[str]:
    """vLLM server arguments shared by every platform; the arms differ only in speculation.

    ``speculative_config_arg=False`` leaves ``--speculative-config`` out (Neuron's Medusa is
    configured through ``--additional-config`` alone).
    """
    s = cfg.serving
    args = [
        f"--model={cfg.target.mount_path}",
        f"--served-model-name={cfg.target.name}",
        "--host=0.0.0.0",
        f"--port={s.port}",
        f"--dtype={s.dtype}",
        f"--max-model-len={s.max_model_len}",
        f"--max-num-seqs={s.max_num_seqs}",
    ]
    if arm == "speculative" and speculative_config_arg:
        draft_path = cfg.draft.location if cfg.draft is not None else None
        args.append(f"--speculative-config={speculative_config(cfg, draft_path)}")
    return args


def _probe(path: str, period_s: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def server_container(cfg: DeployConfig, arm: Arm) -> Obj:
    s = cfg.serving
    hub_draft = cfg.draft is not None and cfg.draft.from_hub
    return {
        "name": SERVER_CONTAINER,
        "image": (cfg.platforms.nvidia or NvidiaConfig()).image,
        "command": list(VLLM_COMMAND),
        "args": vllm_args(cfg, arm),
        "ports": [{"name": "http", "containerPort": s.port, "protocol": "TCP"}],
        # Weights come from the mounted volume; never reach for a model hub at start-up,
        # unless the draft is a hub head (then in both arms, which must stay identical).
        "env": [{"name": "HF_HUB_OFFLINE", "value": "0" if hub_draft else "1"}],
        "resources": {
            "requests": {"cpu": s.cpu, "memory": s.memory},
            "limits": {"memory": s.memory},
        },
        # Startup covers weight loading (and Neuron compilation); readiness gates traffic on
        # the model list; liveness only restarts a server whose health endpoint stops answering.
        "startupProbe": _probe("/v1/models", 10, max(1, s.startup_timeout_s // 10)),
        "readinessProbe": _probe("/v1/models", 5, 3),
        "livenessProbe": _probe("/health", 10, 6),
        "volumeMounts": [
            {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }


def deployment(cfg: DeployConfig, arm: Arm) -> Obj:
    """One arm's Deployment."""
    meta_labels = arm_labels(cfg, arm)
    pod_meta: Obj = {"labels": meta_labels}
    if cfg.monitoring.prometheus_annotations:
        pod_meta["annotations"] = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(cfg.serving.port),
            "prometheus.io/path": "/metrics",
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": arm_name(cfg, arm), "labels": meta_labels},
        "spec": {
            "replicas": cfg.serving.replicas,
            "selector": {"matchLabels": selector(cfg, arm)},
            # Accelerators are whole devices: let the old pod go before the new one starts.
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": pod_meta,
                "spec": {
                    "terminationGracePeriodSeconds": 60,
                    "containers": [server_container(cfg, arm)],
                    "volumes": [
                        {
                            "name": "models",
                            "persistentVolumeClaim": {
                                "claimName": models_claim_name(cfg),
                                "readOnly": True,
                            },
                        },
                        {
                            "name": "dshm",
                            "emptyDir": {"medium": "Memory", "sizeLimit": cfg.serving.shm_size},
                        },
                    ],
                },
            },
        },
    }


def service(cfg: DeployConfig, arm: Arm) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": arm_name(cfg, arm), "labels": arm_labels(cfg, arm)},
        "spec": {
            "type": "ClusterIP",
            "selector": selector(cfg, arm),
            "ports": [{"name": "http", "port": cfg.serving.port, "targetPort": "http"}],
        },
    }


def s3_volume(cfg: DeployConfig, source: S3Source) -> tuple[Obj, Obj]:
    """A statically provisioned PV on the Mountpoint for S3 CSI driver, and its claim."""
    name = models_claim_name(cfg)
    mount_options = ["allow-other", f"region {source.region}", "read-only"]
    if source.prefix:
        mount_options.append(f"prefix {source.prefix.strip('/')}/")
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{cfg.namespace}-{name}", "labels": labels(cfg, "models", name)},
        "spec": {
            "capacity": {"storage": source.capacity},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": cfg.namespace, "name": name},
            "mountOptions": mount_options,
            "csi": {
                "driver": "s3.csi.aws.com",
                "volumeHandle": f"{cfg.namespace}-{name}",
                "volumeAttributes": {"bucketName": source.bucket},
            },
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels(cfg, "models", name)},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": f"{cfg.namespace}-{name}",
            "resources": {"requests": {"storage": source.capacity}},
        },
    }
    return pv, pvc


def service_monitor(cfg: DeployConfig) -> Obj:
    """Prometheus Operator ServiceMonitor scraping both arms' /metrics."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": cfg.name, "labels": labels(cfg, "monitoring", cfg.name)},
        "spec": {
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/part-of": cfg.name,
                    "app.kubernetes.io/name": "specserve-ab",
                },
                "matchExpressions": [
                    {"key": "arm", "operator": "In", "values": list(ARMS)},
                ],
            },
            "podTargetLabels": ["arm"],
            "endpoints": [
                {"port": "http", "path": "/metrics", "interval": cfg.monitoring.scrape_interval}
            ],
        },
    }
