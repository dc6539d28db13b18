"""Write a kustomize tree (``base/`` + ``overlays/<platform>/``) for one deploy config.

The output is deterministic: the same config renders byte-identical files, so rendered
manifests can be checked in and a test can tell when they are stale.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from specserve.deploy import base, jobs
from specserve.deploy.config import DeployConfig
from specserve.deploy.dashboard import build_dashboard
from specserve.deploy.overlays import KUSTOMIZE_API, overlay_kustomization, overlay_patches

DASHBOARD_FILE = "grafana/specserve-ab.json"


class RenderError(RuntimeError):
    """The output folder cannot be written as asked (message says why)."""


def to_yaml(docs: list[dict[str, Any]], header: str) -> str:
    """YAML stream of ``docs`` under a comment header; long strings are never folded."""
    body = "---\n".join(
        yaml.safe_dump(d, sort_keys=False, default_flow_style=False, width=10_000) for d in docs
    )
    return f"# {header}\n{body}"


def dashboard_json() -> str:
    return json.dumps(build_dashboard(), indent=2) + "\n"


def base_files(cfg: DeployConfig) -> dict[str, list[dict[str, Any]]]:
    """``file name -> objects`` of the base (kustomization.yaml excluded)."""
    files: dict[str, list[dict[str, Any]]] = {
        "namespace.yaml": [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": cfg.namespace,
                    "labels": base.labels(cfg, "namespace", cfg.name),
                },
            }
        ]
    }
    assert cfg.model_source is not None
    if cfg.model_source.kind == "s3":
        files["models-volume.yaml"] = list(base.s3_volume(cfg, cfg.model_source))
    for arm in base.ARMS:
        files[f"{arm}-deployment.yaml"] = [base.deployment(cfg, arm)]
        files[f"{arm}-service.yaml"] = [base.service(cfg, arm)]
    if cfg.bench.enabled:
        files["results-pvc.yaml"] = [jobs.results_pvc(cfg)]
        files["bench-job.yaml"] = [jobs.bench_job(cfg)]
    if cfg.monitoring.service_monitor:
        files["servicemonitor.yaml"] = [base.service_monitor(cfg)]
    return files


def base_kustomization(cfg: DeployConfig, resources: list[str]) -> dict[str, Any]:
    kust: dict[str, Any] = {
        "apiVersion": KUSTOMIZE_API,
        "kind": "Kustomization",
        "namespace": cfg.namespace,
        "resources": resources,
    }
    if cfg.monitoring.grafana_dashboard:
        kust["configMapGenerator"] = [
            {
                "name": f"{cfg.name}-dashboard",
                "files": [DASHBOARD_FILE],
                "options": {
                    "disableNameSuffixHash": True,
                    # The label Grafana's dashboard sidecar looks for.
                    "labels": {"grafana_dashboard": "1"},
                },
            }
        ]
    return kust


def render_files(cfg: DeployConfig) -> dict[str, str]:
    """``relative path -> file text`` of the whole tree."""
    header = f"Rendered by `specserve deploy render` for {cfg.name}; edit the config, not this."
    out: dict[str, str] = {}
    files = base_files(cfg)
    for name, docs in files.items():
        out[f"base/{name}"] = to_yaml(docs, header)
    out["base/kustomization.yaml"] = to_yaml([base_kustomization(cfg, list(files))], header)
    if cfg.monitoring.grafana_dashboard:
        out[f"base/{DASHBOARD_FILE}"] = dashboard_json()
    notes = cfg.notes()
    for overlay in cfg.overlays:
        patch_files = []
        for arm, patch in overlay_patches(cfg, overlay).items():
            patch_file = f"{arm}-patch.yaml"
            arm_header = header
            if arm == "speculative":
                # Caveats travel with the manifest they concern.
                arm_header += "".join(f"\n# NOTE: {n}" for n in notes.get(overlay, []))
            out[f"overlays/{overlay}/{patch_file}"] = to_yaml([patch], arm_header)
            patch_files.append(patch_file)
        out[f"overlays/{overlay}/kustomization.yaml"] = to_yaml(
            [overlay_kustomization(patch_files)], header
        )
    return out


def render(cfg: DeployConfig, out_dir: str | Path, force: bool = False) -> list[Path]:
    """Write the tree under ``out_dir``; return the written paths (sorted).

    Existing ``base/`` and ``overlays/`` folders are replaced only with ``force`` (so stale
    files of an earlier render never survive next to new ones).
    """
    root = Path(out_dir)
    for sub in ("base", "overlays"):
        existing = root / sub
        if existing.exists():
            if not force:
                raise RenderError(f"{existing} exists; pass --force to replace it")
            shutil.rmtree(existing)
    written = []
    for rel, text in sorted(render_files(cfg).items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
