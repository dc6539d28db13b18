"""Deploy config validation: good configs load, bad ones fail with a message that says why."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specserve.deploy.config import DeployConfig, DeployConfigError, load_deploy_config
from tests.unit.deploy.deploy_helpers import REFERENCE_CONFIGS, config_dict, make_config


def _fails(match: str, **overrides: Any) -> None:
    with pytest.raises(ValidationError, match=match):
        make_config(**overrides)


@pytest.mark.parametrize("path", REFERENCE_CONFIGS, ids=lambda p: p.stem)
def test_reference_configs_load(path: Path) -> None:
    cfg = load_deploy_config(path)
    assert cfg.overlays


def test_reference_study_settings() -> None:
    cfg = load_deploy_config(Path(REFERENCE_CONFIGS[0]).parent / "qwen3-32b-trn2.yaml")
    assert (cfg.target.name, cfg.draft and cfg.draft.name) == ("Qwen/Qwen3-32B", "Qwen/Qwen3-1.7B")
    assert cfg.speculation.num_speculative_tokens == 7
    assert cfg.platforms.neuron is not None
    assert cfg.platforms.neuron.instance_type == "trn2.48xlarge"
    assert cfg.platforms.neuron.tensor_parallel_size == 32
    assert (cfg.serving.max_num_seqs, cfg.serving.max_model_len) == (4, 1024)


def test_overlays_follow_enabled_platforms() -> None:
    assert make_config().overlays == ("nvidia", "neuron", "specserve-cpu", "specserve-cuda")
    only_gpu = make_config(platforms={"nvidia": {}})
    assert only_gpu.overlays == ("nvidia",)


@pytest.mark.parametrize("k", [0, -1, 17, 100])
def test_k_out_of_range(k: int) -> None:
    _fails(r"num_speculative_tokens must be in 1\.\.16", speculation={"num_speculative_tokens": k})


@pytest.mark.parametrize("k", [1, 7, 16])
def test_k_in_range(k: int) -> None:
    assert (
        make_config(speculation={"num_speculative_tokens": k}).speculation.num_speculative_tokens
        == k
    )


def test_gpu_tp_must_divide_gpus() -> None:
    _fails(
        r"tensor_parallel_size=4 does not divide gpus=6",
        platforms={"nvidia": {"gpus": 6, "tensor_parallel_size": 4}},
    )


def test_neuron_tp_must_divide_cores() -> None:
    # 3 trn2 devices = 12 logical NeuronCores; TP 8 does not divide 12.
    _fails(
        r"tensor_parallel_size=8 does not divide the 12 logical NeuronCores",
        platforms={"neuron": {"neuron_devices": 3, "tensor_parallel_size": 8}},
    )


def test_neuron_devices_beyond_instance() -> None:
    _fails(
        r"neuron_devices=17 exceeds the 16 devices of a trn2\.48xlarge",
        platforms={"neuron": {"neuron_devices": 17, "tensor_parallel_size": 4}},
    )


def test_unknown_neuron_instance() -> None:
    _fails(
        r"unknown Neuron instance_type 'p5\.48xlarge'",
        platforms={"neuron": {"instance_type": "p5.48xlarge", "neuron_devices": 1,
                              "tensor_parallel_size": 1}},
    )  # fmt: skip


def test_mixed_tokenizer_families() -> None:
    _fails(
        r"use different tokenizers",
        draft={"name": "meta-llama/Llama-3.2-1B-Instruct"},
    )


def test_qwen25_draft_for_qwen3_target_is_refused() -> None:
    _fails(
        r"family qwen2\.5.*family qwen3|different tokenizers", draft={"name": "Qwen/Qwen2.5-0.5B"}
    )


def test_same_family_passes_and_unknown_family_warns(caplog: pytest.LogCaptureFixture) -> None:
    make_config(target={"name": "Qwen/Qwen3-32B"}, draft={"name": "Qwen/Qwen3-1.7B"})
    with caplog.at_level(logging.WARNING, logger="specserve.deploy.config"):
        make_config(draft={"name": "my-org/tiny-draft"})
    assert "tokenizer family of my-org/tiny-draft is unknown" in caplog.text


def test_tokenizer_family_override_is_checked() -> None:
    _fails(r"different tokenizers", draft={"name": "my-org/d", "tokenizer_family": "llama3"})


def test_missing_model_source() -> None:
    d = config_dict()
    del d["model_source"]
    with pytest.raises(ValidationError, match="model_source is missing"):
        DeployConfig.model_validate(d)


def test_incomplete_model_sources() -> None:
    _fails(r"model_source\.pvc\.claim_name", model_source={"kind": "pvc"})
    _fails(r"model_source\.s3\.bucket", model_source={"kind": "s3", "region": "us-east-1"})
    _fails(
        r"model_source\.s3\.region",
        model_source={"kind": "s3", "bucket": "b-ucket", "region": "mars"},
    )


def test_draft_rules_by_method() -> None:
    d = config_dict()
    del d["draft"]
    with pytest.raises(ValidationError, match="'draft_model' needs a draft model"):
        DeployConfig.model_validate(d)
    _fails(r"'ngram' takes no draft", speculation={"method": "ngram", "num_speculative_tokens": 4})


def test_no_platform() -> None:
    _fails(r"enable at least one of nvidia, neuron, specserve", platforms={})


def test_unknown_keys_are_refused() -> None:
    _fails(
        r"Extra inputs are not permitted", serving={"max_model_len": 10, "max_num_seqs": 1, "tp": 2}
    )


def test_bad_name() -> None:
    _fails(r"name", name="Demo_Service")


def test_load_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(DeployConfigError, match="no such file"):
        load_deploy_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(DeployConfigError, match="not valid YAML"):
        load_deploy_config(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(DeployConfigError, match="expected a mapping"):
        load_deploy_config(bad)
    d = config_dict(speculation={"num_speculative_tokens": 40})
    bad.write_text(yaml.safe_dump(d))
    with pytest.raises(DeployConfigError) as info:
        load_deploy_config(bad)
    assert "speculation: num_speculative_tokens must be in 1..16, got 40" in str(info.value)
