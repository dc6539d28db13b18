"""The checked-in reference manifests (deploy/k8s/) are what their configs render today,
and ``specserve deploy`` works end to end from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specserve.cli import main
from specserve.deploy.config import load_deploy_config
from specserve.deploy.render import render_files

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "deploy" / "configs").glob("*.yaml"))


def test_reference_configs_exist() -> None:
    assert {p.stem for p in CONFIGS} >= {"qwen3-32b-trn2", "qwen25-coder-gpu"}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_checked_in_manifests_are_current(config: Path) -> None:
    tree = REPO / "deploy" / "k8s" / config.stem
    expected = render_files(load_deploy_config(config))
    actual = {
        str(p.relative_to(tree)): p.read_text() for p in sorted(tree.rglob("*")) if p.is_file()
    }
    hint = (
        f"deploy/k8s/{config.stem} is stale: run `specserve deploy render "
        f"deploy/configs/{config.name} -o deploy/k8s/{config.stem} --force`"
    )
    assert sorted(actual) == sorted(expected), hint
    for name, text in expected.items():
        assert actual[name] == text, f"{name}: {hint}"


def test_cli_render_then_refuse_then_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = REPO / "deploy" / "configs" / "qwen25-coder-gpu.yaml"
    out = tmp_path / "out"
    assert main(["deploy", "render", str(config), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kubectl apply -k" in printed and "overlays/nvidia" in printed
    assert (out / "overlays" / "specserve-cuda" / "kustomization.yaml").is_file()
    assert main(["deploy", "render", str(config), "-o", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert main(["deploy", "render", str(config), "-o", str(out), "--force"]) == 0


def test_cli_reports_invalid_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = yaml.safe_load((REPO / "deploy" / "configs" / "qwen3-32b-trn2.yaml").read_text())
    raw["platforms"]["neuron"]["tensor_parallel_size"] = 24
    raw["draft"]["name"] = "meta-llama/Llama-3.2-1B-Instruct"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    assert main(["deploy", "render", str(bad), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "tensor_parallel_size=24 does not divide the 32 logical NeuronCores" in err
    assert not (tmp_path / "out").exists()


def test_cli_dashboard(tmp_path: Path) -> None:
    out = tmp_path / "dash.json"
    assert main(["deploy", "dashboard", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["uid"] == "specserve-ab"


def test_cli_wait_times_out_on_a_dead_url(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["deploy", "wait", "http://127.0.0.1:9", "--timeout-s=0", "--interval-s=0"])
    assert rc == 1
    assert "not ready after" in capsys.readouterr().err


def test_cli_emf_relays_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = {
        "_aws": {
            "Timestamp": 1,
            "CloudWatchMetrics": [
                {"Namespace": "specserve/bench", "Dimensions": [["Variant"]], "Metrics": []}
            ],
        },
        "Variant": "baseline",
    }
    (tmp_path / "emf.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["deploy", "emf", str(tmp_path), "--dimension", "Deployment=x"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["Deployment"] == "x"
    assert main(["deploy", "emf", str(tmp_path), "--dimension", "oops"]) == 2
