"""Every rendered manifest validates against the Kubernetes OpenAPI schemas, offline.

Core kinds use the schemas that ship with ``kubernetes-validate`` (strict: unknown fields are
errors). The ServiceMonitor CRD is not in them; it is checked against the subset of the
Prometheus Operator schema kept in ``schemas/servicemonitor-v1.schema.json``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from specserve.deploy.config import load_deploy_config
from specserve.deploy.render import render
from tests.unit.deploy.deploy_helpers import REFERENCE_CONFIGS, kustomize_build, make_config

K8S_VERSION = "1.37.0"
SERVICE_MONITOR_SCHEMA = json.loads(
    (Path(__file__).parent / "schemas" / "servicemonitor-v1.schema.json").read_text()
)


def validate(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` is not a valid Kubernetes object."""
    if obj["apiVersion"] == "monitoring.coreos.com/v1":
        jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _base_objects(tree: Path) -> list[dict[str, Any]]:
    objs = []
    for path in sorted((tree / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            objs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return objs


def test_demo_base_validates(demo_tree: Path) -> None:
    objs = _base_objects(demo_tree)
    assert {o["kind"] for o in objs} >= {"Deployment", "Service", "Job", "ServiceMonitor"}
    for obj in objs:
        validate(obj)


@pytest.mark.parametrize("overlay", make_config().overlays)
def test_demo_overlay_builds_validate(
    demo_builds: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    for obj in demo_builds[overlay]:
        validate(obj)


def validate_rendered(cfg: Any, tree: Path) -> None:
    """Render ``cfg`` into ``tree`` and validate the base and every built overlay."""
    render(cfg, tree)
    for obj in _base_objects(tree):
        validate(obj)
    for overlay in cfg.overlays:
        built = kustomize_build(tree / "overlays" / overlay)
        assert built
        for obj in built:
            validate(obj)


@pytest.mark.parametrize("path", REFERENCE_CONFIGS, ids=lambda p: p.stem)
def test_reference_configs_validate(path: Path, tmp_path: Path) -> None:
    validate_rendered(load_deploy_config(path), tmp_path)


def test_validators_reject_broken_objects(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    """The checks above can fail: a misspelt field and a bad type are caught."""
    objs = demo_builds["nvidia"]
    dep = copy.deepcopy(next(o for o in objs if o["kind"] == "Deployment"))
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy "] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(dep)
    dep = copy.deepcopy(next(o for o in objs if o["kind"] == "Deployment"))
    dep["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(dep)
    monitor = copy.deepcopy(next(o for o in objs if o["kind"] == "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)
