"""Deploy-test helpers: a minimal valid config, kustomize builds, object lookups."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specserve.deploy.config import DeployConfig

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "deploy" / "configs"
REFERENCE_CONFIGS = sorted(CONFIGS.glob("*.yaml"))

BASE_CONFIG: dict[str, Any] = {
    "name": "demo",
    "target": {"name": "Qwen/Qwen3-8B"},
    "draft": {"name": "Qwen/Qwen3-0.6B"},
    "model_source": {"kind": "pvc", "claim_name": "weights"},
    "speculation": {"num_speculative_tokens": 5},
    "serving": {"max_model_len": 2048, "max_num_seqs": 8},
    "platforms": {
        "nvidia": {"gpus": 2, "tensor_parallel_size": 2},
        "neuron": {
            "instance_type": "trn2.48xlarge",
            "neuron_devices": 4,
            "tensor_parallel_size": 16,
        },
        "specserve": {"cpu": True, "cuda": True},
    },
    "bench": {"cloudwatch_emf": {"namespace": "Test/AB"}},
}


def config_dict(**overrides: Any) -> dict[str, Any]:
    """A deep copy of BASE_CONFIG with top-level keys replaced."""
    d = copy.deepcopy(BASE_CONFIG)
    d.update(overrides)
    return d


def make_config(**overrides: Any) -> DeployConfig:
    return DeployConfig.model_validate(config_dict(**overrides))


def kustomize_build(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` output as objects (kubectl ships kustomize)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with built-in kustomize) is not installed; overlays not built")
    out = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} matches"
    return matches[0]


def all_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Init and regular containers of a Deployment or Job."""
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]
