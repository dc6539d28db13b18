"""The benchmark Job and its results volume.

The Job runs specserve's CPU image (the bench speaks HTTP only, so it needs no accelerator):
``specserve deploy wait`` until both arms answer ``/v1/models``, then ``specserve bench`` with
``--baseline`` and ``--candidate`` (the bench alternates the arms), writing to a PVC, then
optionally ``specserve deploy emf`` to print the run's CloudWatch EMF lines to the log.
"""

from __future__ import annotations

from typing import Any

from specserve.deploy.base import (
    ARMS,
    RESULTS_MOUNT,
    Arm,
    Obj,
    arm_name,
    labels,
)
from specserve.deploy.config import DeployConfig
from specserve.deploy.platforms import SpecserveConfig

SPECSERVE_COMMAND = ["specserve"]


def bench_name(cfg: DeployConfig) -> str:
    return f"{cfg.name}-bench"


def results_claim_name(cfg: DeployConfig) -> str:
    return f"{cfg.name}-results"


def arm_url(cfg: DeployConfig, arm: Arm) -> str:
    return f"http://{arm_name(cfg, arm)}:{cfg.serving.port}"


def results_pvc(cfg: DeployConfig) -> Obj:
    spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": cfg.bench.results_storage}},
    }
    if cfg.bench.results_storage_class is not None:
        spec["storageClassName"] = cfg.bench.results_storage_class
    name = results_claim_name(cfg)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels(cfg, "results", name)},
        "spec": spec,
    }


def wait_args(cfg: DeployConfig) -> list[str]:
    """Arguments after ``specserve``: block until both arms are ready."""
    return ["deploy", "wait", *(arm_url(cfg, a) for a in ARMS), "--timeout-s=7200"]


def bench_args(cfg: DeployConfig) -> list[str]:
    """Arguments after ``specserve``: the A/B benchmark of baseline vs speculative."""
    b = cfg.bench
    args = [
        "bench",
        f"--baseline={arm_url(cfg, 'baseline')}",
        f"--candidate={arm_url(cfg, 'speculative')}",
        f"--model={cfg.target.name}",
        f"--endpoint={b.endpoint}",
    ]
    args += [
        f"--suite={','.join(b.suites)}",
        f"--concurrency={b.concurrency}",
        f"--num-requests={b.num_requests}",
        f"--max-tokens={b.max_tokens}",
        f"--warmup={b.warmup_requests}",
        f"--output={RESULTS_MOUNT}/$(JOB_NAME)",
        "--no-progress",  # a progress bar only garbles the pod log
    ]
    return args


def emf_args(cfg: DeployConfig) -> list[str]:
    """Arguments after ``specserve``: the run's EMF lines (``emf.jsonl``) to stdout."""
    assert cfg.bench.cloudwatch_emf is not None
    return [
        "deploy",
        "emf",
        f"{RESULTS_MOUNT}/$(JOB_NAME)",
        f"--namespace={cfg.bench.cloudwatch_emf.namespace}",
        f"--dimension=Deployment={cfg.name}",
        f"--dimension=Model={cfg.target.name}",
    ]


def _container(name: str, image: str, args: list[str]) -> Obj:
    return {
        "name": name,
        "image": image,
        "command": list(SPECSERVE_COMMAND),
        "args": args,
        "env": [
            {
                "name": "JOB_NAME",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}},
            }
        ],
        "resources": {
            "requests": {"cpu": "1", "memory": "2Gi"},
            "limits": {"memory": "4Gi"},
        },
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_MOUNT}],
    }


def bench_job(cfg: DeployConfig) -> Obj:
    """The benchmark Job (steps run in order as init containers, the last as the container)."""
    image = (cfg.platforms.specserve or SpecserveConfig()).image("cpu")
    steps = [("wait-for-arms", wait_args(cfg)), ("bench", bench_args(cfg))]
    if cfg.bench.cloudwatch_emf is not None:
        steps.append(("emf", emf_args(cfg)))
    containers = [_container(name, image, args) for name, args in steps]
    name = bench_name(cfg)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # The image runs as uid 1000; fsGroup makes the results volume writable for it.
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
        "initContainers": containers[:-1],
        "containers": containers[-1:],
        "volumes": [
            {"name": "results", "persistentVolumeClaim": {"claimName": results_claim_name(cfg)}}
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels(cfg, "benchmark", name)},
        "spec": {
            # A rerun would append a second run to the same results folder: fail loudly instead.
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels(cfg, "benchmark", name)},
                "spec": pod_spec,
            },
        },
    }
