"""Rendered tree: layout, arguments, and the arms differing only in speculation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from specserve.deploy.render import RenderError, render, render_files
from tests.unit.deploy.deploy_helpers import all_containers, find, make_config


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_layout(demo_tree: Path) -> None:
    files = {str(p.relative_to(demo_tree)) for p in demo_tree.rglob("*") if p.is_file()}
    assert "base/kustomization.yaml" in files
    assert "base/grafana/specserve-ab.json" in files
    for overlay in ("nvidia", "neuron", "specserve-cpu", "specserve-cuda"):
        assert f"overlays/{overlay}/kustomization.yaml" in files
        assert f"overlays/{overlay}/baseline-patch.yaml" in files
    kust = _load(demo_tree / "base" / "kustomization.yaml")[0]
    for resource in kust["resources"]:
        assert (demo_tree / "base" / resource).is_file()


def test_render_is_deterministic() -> None:
    assert render_files(make_config()) == render_files(make_config())


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    cfg = make_config()
    render(cfg, tmp_path)
    stale = tmp_path / "overlays" / "old-overlay" / "x.yaml"
    stale.parent.mkdir()
    stale.write_text("stale")
    with pytest.raises(RenderError, match="pass --force"):
        render(cfg, tmp_path)
    render(cfg, tmp_path, force=True)
    assert not stale.exists()


def _args(deployment: dict[str, Any]) -> list[str]:
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def _spec_config(args: list[str]) -> dict[str, Any]:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith("--speculative-config=")]
    return dict(json.loads(value))


def _without_arm(obj: dict[str, Any], arm: str) -> str:
    """The object as text with the arm's name removed, for comparing the arms."""
    return json.dumps(obj, sort_keys=True).replace(arm, "ARM")


@pytest.mark.parametrize("overlay", ["nvidia", "neuron"])
def test_vllm_arms_identical_except_speculation(
    demo_builds: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    objs = demo_builds[overlay]
    baseline = copy.deepcopy(find(objs, "Deployment", "demo-baseline"))
    speculative = copy.deepcopy(find(objs, "Deployment", "demo-speculative"))
    spec_args = _args(speculative)
    spec = _spec_config(spec_args)
    assert spec == {
        "model": "/models/Qwen/Qwen3-0.6B",
        "num_speculative_tokens": 5,
        "method": "draft_model",
    }
    extra = [a for a in spec_args if a not in _args(baseline)]
    expected_extra = 2 if overlay == "neuron" else 1
    assert len(extra) == expected_extra
    speculative["spec"]["template"]["spec"]["containers"][0]["args"] = [
        a for a in spec_args if a not in extra
    ]
    # Compiled-artifact folders are per arm by design; everything else must match.
    assert _without_arm(baseline, "baseline") == _without_arm(speculative, "speculative")


def test_neuron_arguments(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    objs = demo_builds["neuron"]
    spec = find(objs, "Deployment", "demo-speculative")
    container = spec["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert "--tensor-parallel-size=16" in args
    assert "--max-num-seqs=8" in args and "--max-model-len=2048" in args
    (extra,) = [a.split("=", 1)[1] for a in args if a.startswith("--additional-config=")]
    assert json.loads(extra) == {"override_neuron_config": {"enable_fused_speculation": True}}
    assert container["resources"]["limits"]["aws.amazon.com/neuron"] == 4
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    pod = spec["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "trn2.48xlarge"}
    assert container["image"].startswith("public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:")
    base = find(objs, "Deployment", "demo-baseline")["spec"]["template"]["spec"]["containers"][0]
    assert not any(a.startswith("--additional-config") for a in base["args"])


def test_nvidia_arguments(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    container = find(demo_builds["nvidia"], "Deployment", "demo-speculative")["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert "--tensor-parallel-size=2" in container["args"]
    assert not any(a.startswith("--pipeline-parallel-size") for a in container["args"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "aws.amazon.com/neuron" not in container["resources"]["limits"]


def test_pipeline_stages_use_every_gpu() -> None:
    cfg = make_config(platforms={"nvidia": {"gpus": 4, "tensor_parallel_size": 2}})
    patch = yaml.safe_load(render_files(cfg)["overlays/nvidia/speculative-patch.yaml"])
    args = patch["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--pipeline-parallel-size=2" in args


def test_specserve_arguments(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    for overlay in ("specserve-cpu", "specserve-cuda"):
        objs = demo_builds[overlay]
        base = find(objs, "Deployment", "demo-baseline")["spec"]["template"]["spec"]
        spec = find(objs, "Deployment", "demo-speculative")["spec"]["template"]["spec"]
        b, s = base["containers"][0], spec["containers"][0]
        assert b["command"] == s["command"] == ["specserve"]
        assert b["args"][0] == s["args"][0] == "serve"
        assert "--spec-method=none" in b["args"]
        assert "--draft-model=/models/Qwen/Qwen3-0.6B" in s["args"]
        assert "--num-speculative-tokens=5" in s["args"]
        variant = overlay.removeprefix("specserve-")
        assert b["image"] == s["image"] and b["image"].endswith(f"-{variant}")
        has_gpu = "nvidia.com/gpu" in s.get("resources", {}).get("limits", {})
        assert has_gpu == (variant == "cuda")


def test_adaptive_k_and_ngram() -> None:
    cfg = make_config(
        draft=None,
        speculation={"method": "ngram", "num_speculative_tokens": 4},
        platforms={"specserve": {"adaptive_k": True, "cuda": False}},
    )
    files = render_files(cfg)
    patch = yaml.safe_load(files["overlays/specserve-cpu/speculative-patch.yaml"])
    args = patch["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--spec-method=ngram" in args and "--num-speculative-tokens=auto" in args
    assert "--k-max=4" in args
    base_dep = yaml.safe_load(files["base/speculative-deployment.yaml"])
    spec = _spec_config(_args(base_dep))
    assert spec == {"num_speculative_tokens": 4, "method": "ngram", "prompt_lookup_max": 4}


@pytest.mark.parametrize("overlay", ["nvidia", "neuron", "specserve-cpu", "specserve-cuda"])
def test_images_are_pinned(demo_builds: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    for obj in demo_builds[overlay]:
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        for c in all_containers(obj):
            repo, _, tag = c["image"].rpartition(":")
            assert repo and "/" not in tag, c["image"]
            assert tag and tag != "latest", c["image"]


def test_labels_and_probes(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    objs = demo_builds["nvidia"]
    for obj in objs:
        if obj["kind"] == "ConfigMap":
            continue
        labels = obj["metadata"]["labels"]
        for key in ("name", "instance", "component", "part-of", "managed-by"):
            assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], key)
    for arm in ("baseline", "speculative"):
        dep = find(objs, "Deployment", f"demo-{arm}")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert c["startupProbe"]["httpGet"]["path"] == "/v1/models"
        assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["arm"] == arm
        svc = find(objs, "Service", f"demo-{arm}")
        assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_model_volume_sources() -> None:
    pvc_cfg = make_config()
    files = render_files(pvc_cfg)
    dep = yaml.safe_load(files["base/baseline-deployment.yaml"])
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["models"]["persistentVolumeClaim"]["claimName"] == "weights"
    assert "base/models-volume.yaml" not in files

    s3_cfg = make_config(
        model_source={"kind": "s3", "bucket": "my-bucket", "region": "us-east-2", "prefix": "hf"}
    )
    files = render_files(s3_cfg)
    pv, pvc = [d for d in yaml.safe_load_all(files["base/models-volume.yaml"]) if d]
    assert pv["spec"]["csi"]["driver"] == "s3.csi.aws.com"
    assert pv["spec"]["csi"]["volumeAttributes"] == {"bucketName": "my-bucket"}
    assert "region us-east-2" in pv["spec"]["mountOptions"]
    assert "prefix hf/" in pv["spec"]["mountOptions"]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    dep = yaml.safe_load(files["base/baseline-deployment.yaml"])
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["models"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]


def test_bench_job(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    job = find(demo_builds["nvidia"], "Job", "demo-bench")
    steps = all_containers(job)
    assert [c["name"] for c in steps] == ["wait-for-arms", "bench", "emf"]
    bench = steps[1]["args"]
    assert "--baseline=http://demo-baseline:8000" in bench
    assert "--candidate=http://demo-speculative:8000" in bench
    assert "--model=Qwen/Qwen3-8B" in bench
    assert "--output=/results/$(JOB_NAME)" in bench
    claims = [
        v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]
    ]
    assert claims == ["demo-results"]
    assert job["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 1000
    assert find(demo_builds["nvidia"], "PersistentVolumeClaim", "demo-results")


def test_bench_and_monitoring_can_be_turned_off() -> None:
    cfg = make_config(
        bench={"enabled": False},
        monitoring={"service_monitor": False, "prometheus_annotations": False,
                    "grafana_dashboard": False},
    )  # fmt: skip
    files = render_files(cfg)
    assert not any("bench" in f or "servicemonitor" in f or "grafana" in f for f in files)
    dep = yaml.safe_load(files["base/baseline-deployment.yaml"])
    assert "annotations" not in dep["spec"]["template"]["metadata"]


def test_neuron_config_key_is_selectable() -> None:
    platforms = {
        "neuron": {
            "neuron_devices": 4,
            "tensor_parallel_size": 16,
            "neuron_config_key": "neuron_config",
        }
    }
    files = render_files(make_config(platforms=platforms))
    patch = yaml.safe_load(files["overlays/neuron/speculative-patch.yaml"])
    args = patch["spec"]["template"]["spec"]["containers"][0]["args"]
    (extra,) = [a.split("=", 1)[1] for a in args if a.startswith("--additional-config=")]
    assert json.loads(extra) == {"neuron_config": {"enable_fused_speculation": True}}
    platforms["neuron"]["fused_speculation"] = False  # type: ignore[index]
    files = render_files(make_config(platforms=platforms))
    patch = yaml.safe_load(files["overlays/neuron/speculative-patch.yaml"])
    args = patch["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--additional-config") for a in args)
