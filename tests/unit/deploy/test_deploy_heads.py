"""Head-based speculation (EAGLE, EAGLE-3, Medusa) in the rendered A/B: arguments, Neuron
overrides, validation, and manifests that still validate against the Kubernetes schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specserve.cli import build_parser, main
from specserve.commands.serve import engine_config_from_args
from specserve.config import SPEC_METHODS
from specserve.deploy.config import DeployConfig, load_deploy_config
from specserve.deploy.platforms import image_version
from specserve.deploy.render import render_files
from tests.unit.deploy.deploy_helpers import CONFIGS, REPO, config_dict
from tests.unit.deploy.test_deploy_schemas import validate_rendered

HEAD = {"name": "my-org/qwen3-8b-eagle3", "path": "heads/qwen3-8b-eagle3"}
HEAD_MOUNT = "/models/heads/qwen3-8b-eagle3"
NEURON = {"neuron_devices": 4, "tensor_parallel_size": 16}
EXAMPLE = CONFIGS / "qwen25-coder-gpu-eagle3.yaml"


def head_config(method: str, k: int = 3, **overrides: Any) -> DeployConfig:
    """The demo config (every platform) drafting with a head."""
    d = config_dict(draft=HEAD, speculation={"method": method, "num_speculative_tokens": k})
    d.update(overrides)
    return DeployConfig.model_validate(d)


def _fails(match: str, **overrides: Any) -> None:
    with pytest.raises(ValidationError, match=match):
        DeployConfig.model_validate(config_dict(**overrides))


def _container(files: dict[str, str], overlay: str, arm: str = "speculative") -> dict[str, Any]:
    patch = yaml.safe_load(files[f"overlays/{overlay}/{arm}-patch.yaml"])
    return dict(patch["spec"]["template"]["spec"]["containers"][0])


def _flag(args: list[str], name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    assert len(values) <= 1, args
    return values[0] if values else None


def _spec(args: list[str]) -> dict[str, Any] | None:
    value = _flag(args, "--speculative-config")
    return None if value is None else dict(json.loads(value))


def _neuron_extra(args: list[str]) -> dict[str, Any] | None:
    value = _flag(args, "--additional-config")
    return None if value is None else dict(json.loads(value))


# --- vLLM on NVIDIA: --speculative-config exactly as vLLM spells it ------------------------


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa"])
def test_nvidia_speculative_config(method: str) -> None:
    files = render_files(head_config(method))
    args = _container(files, "nvidia")["args"]
    assert _spec(args) == {"method": method, "model": HEAD_MOUNT, "num_speculative_tokens": 3}
    assert _spec(_container(files, "nvidia", "baseline")["args"]) is None


def test_hub_head_is_passed_by_name_and_hub_access_is_allowed() -> None:
    hub = {"name": "RedHatAI/Qwen3-8B-speculator.eagle3", "from_hub": True}
    cfg = head_config("eagle3", draft=hub, platforms={"nvidia": {}})
    files = render_files(cfg)
    args = _container(files, "nvidia")["args"]
    assert _spec(args) == {
        "method": "eagle3",
        "model": "RedHatAI/Qwen3-8B-speculator.eagle3",
        "num_speculative_tokens": 3,
    }
    for arm in ("baseline", "speculative"):  # the arms stay identical apart from speculation
        dep = yaml.safe_load(files[f"base/{arm}-deployment.yaml"])
        env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "HF_HUB_OFFLINE", "value": "0"} in env
    assert any("Hugging Face Hub" in n for n in cfg.notes()["nvidia"])


def test_volume_heads_keep_the_hub_offline() -> None:
    dep = yaml.safe_load(render_files(head_config("eagle3"))["base/speculative-deployment.yaml"])
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in env


def test_image_version_parsing() -> None:
    assert image_version("vllm/vllm-openai:v0.23.0") == (0, 23, 0)
    assert image_version("vllm/vllm-openai:v0.10.1.1") == (0, 10, 1)
    assert image_version("registry:5000/vllm:0.28") == (0, 28, 0)
    assert image_version(
        "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.11.0-neuronx-py312"
    ) == (0, 11, 0)
    assert image_version("vllm/vllm-openai:latest") is None
    assert image_version("vllm/vllm-openai@sha256:" + "0" * 64) is None
    assert image_version("registry:5000/vllm") is None


@pytest.mark.parametrize("tag", ["v0.29.0", "v0.33.0", "v1.0.0"])
def test_medusa_refused_on_new_vllm(tag: str) -> None:
    with pytest.raises(ValidationError, match=r"Medusa is checked up to vLLM 0\.28 and removed"):
        head_config("medusa", platforms={"nvidia": {"image": f"vllm/vllm-openai:{tag}"}})


@pytest.mark.parametrize("tag", ["v0.23.0", "v0.28.1"])
def test_medusa_accepted_on_old_vllm(tag: str) -> None:
    cfg = head_config("medusa", platforms={"nvidia": {"image": f"vllm/vllm-openai:{tag}"}})
    assert "nvidia" not in cfg.notes()


def test_medusa_on_unversioned_image_warns() -> None:
    cfg = head_config("medusa", platforms={"nvidia": {"image": "my-registry/vllm:prod"}})
    (note,) = cfg.notes()["nvidia"]
    assert "cannot read a vLLM version" in note and "<= 0.28" in note
    patch = render_files(cfg)["overlays/nvidia/speculative-patch.yaml"]
    assert "# NOTE: cannot read a vLLM version" in patch


# --- Neuron: NxD Inference's NeuronConfig through override_neuron_config --------------------


def test_neuron_eagle() -> None:
    files = render_files(head_config("eagle", platforms={"neuron": NEURON}))
    args = _container(files, "neuron")["args"]
    assert _spec(args) == {"method": "eagle", "model": HEAD_MOUNT, "num_speculative_tokens": 3}
    assert _neuron_extra(args) == {
        "override_neuron_config": {"enable_fused_speculation": True,
                                   "enable_eagle_speculation": True}
    }  # fmt: skip
    assert _neuron_extra(_container(files, "neuron", "baseline")["args"]) is None


def test_neuron_eagle3() -> None:
    cfg = head_config("eagle3", platforms={"neuron": NEURON})
    files = render_files(cfg)
    args = _container(files, "neuron")["args"]
    assert _spec(args) == {"method": "eagle3", "model": HEAD_MOUNT, "num_speculative_tokens": 3}
    assert _neuron_extra(args) == {
        "override_neuron_config": {
            "enable_fused_speculation": True,
            "enable_eagle_speculation": True,
            "is_eagle3": True,
        }
    }
    assert any("EAGLE-3 through the vLLM Neuron plugin is unverified" in n
               for n in cfg.notes()["neuron"])  # fmt: skip


def test_neuron_eagle3_with_newer_plugin_key() -> None:
    neuron = {**NEURON, "neuron_config_key": "neuron_config"}
    args = _container(render_files(head_config("eagle3", platforms={"neuron": neuron})), "neuron")
    extra = _neuron_extra(args["args"])
    assert extra is not None and list(extra) == ["neuron_config"]
    assert extra["neuron_config"]["is_eagle3"] is True


def test_neuron_medusa() -> None:
    cfg = head_config("medusa", k=4, platforms={"neuron": NEURON})
    files = render_files(cfg)
    args = _container(files, "neuron")["args"]
    # The heads live in the target's folder; vLLM gets no draft to load.
    assert _spec(args) is None
    assert _neuron_extra(args) == {
        "override_neuron_config": {
            "is_medusa": True,
            "medusa_speculation_length": 5,
            "num_medusa_heads": 4,
        }
    }
    base_args = _container(files, "neuron", "baseline")["args"]
    (extra,) = [a for a in args if a not in base_args]
    assert extra.startswith("--additional-config=")
    notes = cfg.notes()["neuron"]
    assert any("/models/Qwen/Qwen3-8B/medusa_heads.pt" in n and "convert" in n for n in notes)
    patch = files["overlays/neuron/speculative-patch.yaml"]
    heads_file = "/models/Qwen/Qwen3-8B/medusa_heads.pt"
    assert f"# NOTE: NxD Inference loads Medusa heads from {heads_file}" in patch
    assert "# NOTE" not in files["overlays/neuron/baseline-patch.yaml"]


def test_neuron_eagle_needs_fused_speculation() -> None:
    with pytest.raises(ValidationError, match=r"'eagle3' runs as fused speculation on Neuron"):
        head_config("eagle3", platforms={"neuron": {**NEURON, "fused_speculation": False}})
    # Medusa is no fused draft: the switch does not matter there.
    head_config("medusa", platforms={"neuron": {**NEURON, "fused_speculation": False}})


def test_neuron_refuses_hub_heads() -> None:
    with pytest.raises(ValidationError, match=r"hub head \(draft\.from_hub\) is not rendered"):
        head_config(
            "eagle3",
            draft={"name": "RedHatAI/Qwen3-8B-speculator.eagle3", "from_hub": True},
            platforms={"neuron": NEURON},
        )


# --- specserve's own server ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "served"), [("eagle", "eagle"), ("eagle3", "eagle"), ("medusa", "medusa")]
)
def test_specserve_head_arguments(method: str, served: str) -> None:
    files = render_files(head_config(method))
    for variant in ("cpu", "cuda"):
        spec_args = _container(files, f"specserve-{variant}")["args"]
        assert f"--spec-method={served}" in spec_args
        assert f"--draft-model={HEAD_MOUNT}" in spec_args
        assert "--num-speculative-tokens=3" in spec_args
        base_args = _container(files, f"specserve-{variant}", "baseline")["args"]
        assert "--spec-method=none" in base_args
        assert not any(a.startswith("--draft-model") for a in base_args)


def test_specserve_eagle1_notes_the_head_format() -> None:
    notes = head_config("eagle").notes()
    assert "reads EAGLE-3 heads" in notes["specserve-cpu"][0]
    assert "specserve-cpu" not in head_config("eagle3").notes()


@pytest.mark.parametrize(("method", "served"), [("eagle3", "eagle"), ("medusa", "medusa")])
def test_specserve_head_arguments_parse(method: str, served: str) -> None:
    """specserve's own parser and engine config take the rendered command line."""
    if served not in SPEC_METHODS:
        pytest.skip(f"specserve serve does not offer --spec-method {served} yet")
    files = render_files(head_config(method))
    args = build_parser().parse_args(_container(files, "specserve-cpu")["args"])
    assert (args.spec_method, args.draft_model) == (served, HEAD_MOUNT)
    spec = engine_config_from_args(args).spec
    assert (spec.method, spec.draft_model, spec.num_speculative_tokens) == (served, HEAD_MOUNT, 3)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa"])
def test_head_methods_need_a_head(method: str) -> None:
    d = config_dict(speculation={"method": method, "num_speculative_tokens": 3})
    del d["draft"]
    with pytest.raises(ValidationError, match=rf"'{method}' needs a head \(draft\)"):
        DeployConfig.model_validate(d)


def test_medusa_k_must_match_heads() -> None:
    spec = {"method": "medusa", "num_speculative_tokens": 3, "num_heads": 4}
    _fails(r"num_speculative_tokens=3 must equal num_heads=4", draft=HEAD, speculation=spec)
    spec["num_heads"] = 3
    cfg = DeployConfig.model_validate(config_dict(draft=HEAD, speculation=spec))
    assert cfg.speculation.num_heads == 3


def test_num_heads_only_for_medusa() -> None:
    spec = {"method": "eagle3", "num_speculative_tokens": 3, "num_heads": 3}
    _fails(r"num_heads is for method 'medusa', not 'eagle3'", draft=HEAD, speculation=spec)


def test_hub_flag_rules() -> None:
    _fails(r"target\.from_hub", target={"name": "Qwen/Qwen3-8B", "from_hub": True})
    _fails(
        r"from_hub downloads the name.*remove path",
        draft={"name": "a/b", "path": "heads/b", "from_hub": True},
        speculation={"method": "eagle3", "num_speculative_tokens": 3},
    )


def test_heads_skip_the_tokenizer_check() -> None:
    # A head is no language model of its own: its name says nothing about a tokenizer.
    head_config("eagle3", draft={"name": "meta-llama/Llama-3.2-1B-Instruct", "path": "h"})


# --- manifests validate; the example config is rendered and checked in ---------------------


@pytest.mark.parametrize("method", ["eagle3", "medusa"])
def test_head_manifests_validate(method: str, tmp_path: Path) -> None:
    validate_rendered(head_config(method), tmp_path)


def test_example_config() -> None:
    cfg = load_deploy_config(EXAMPLE)
    assert cfg.speculation.method == "eagle3" and cfg.draft is not None
    assert cfg.target.name == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    tree = REPO / "deploy" / "k8s" / EXAMPLE.stem
    expected = render_files(cfg)
    actual = {str(p.relative_to(tree)): p.read_text() for p in tree.rglob("*") if p.is_file()}
    assert actual == expected, (
        f"deploy/k8s/{EXAMPLE.stem} is stale: run `specserve deploy render "
        f"deploy/configs/{EXAMPLE.name} -o deploy/k8s/{EXAMPLE.stem} --force`"
    )
    args = _container(expected, "nvidia")["args"]
    assert _spec(args) == {
        "method": "eagle3",
        "model": "/models/heads/qwen25-coder-1.5b-eagle3",
        "num_speculative_tokens": 3,
    }


def test_cli_prints_notes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = config_dict(draft=HEAD, speculation={"method": "medusa", "num_speculative_tokens": 3},
                      platforms={"neuron": NEURON})  # fmt: skip
    path = tmp_path / "medusa.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["deploy", "render", str(path), "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "warning: neuron: NxD Inference loads Medusa heads from" in err
