"""Draft heads on disk: our own write/read round trip, and (slow) the EAGLE-3 directory
checked by the real ``speculators`` package through ``benchmarks/speculators_roundtrip.py``."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from specserve.loading.head_writer import eagle3_head_config, medusa_head_config, write_head
from specserve.loading.spec_heads import load_eagle3, load_medusa, read_head_info
from tests.conftest import make_tiny_model
from tests.heads import make_eagle_head, make_medusa_heads

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "speculators_roundtrip.py"


def _script() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPT))


# Read before the autouse fixture points $SPECSERVE_CACHE_DIR at a per-test folder, so the
# private speculators install is made once per machine, not once per run.
INSTALL_DIR: Path = _script()["default_install_dir"]()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("draft_vocab", [None, 40], ids=["full-vocab", "draft-vocab-40"])
def test_eagle3_head_round_trip(tmp_path: Path, dtype: torch.dtype, draft_vocab: int | None):
    target = make_tiny_model("llama")
    head = make_eagle_head(target, seed=3, draft_vocab_size=draft_vocab)
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in head.state_dict().items()}
    config = eagle3_head_config(
        head.cfg, verifier="tiny-llama", verifier_arch="LlamaForCausalLM", num_speculative_tokens=4
    )
    path = tmp_path / "head"
    write_head(path, config, tensors, training={"method": "eagle"})

    info = read_head_info(path)
    assert info.method == "eagle"
    assert info.verifier == "tiny-llama"
    assert info.training == {"method": "eagle"}
    assert info.config == config
    loaded = load_eagle3(info, target.cfg, dtype)
    assert loaded.cfg == head.cfg
    got = loaded.state_dict()
    assert got.keys() == tensors.keys()
    for key, want in tensors.items():
        assert got[key].dtype == want.dtype, key
        assert torch.equal(got[key], want), key
    ids = torch.arange(head.cfg.draft_vocab_size)
    assert torch.equal(loaded.target_ids(ids), head.target_ids(ids))
    assert int(loaded.t2d.sum()) == head.cfg.draft_vocab_size


def test_eagle3_head_config_fields(tmp_path: Path) -> None:
    target = make_tiny_model("llama")
    head = make_eagle_head(target, seed=1, draft_vocab_size=50, aux_layer_ids=(1, 2))
    config = eagle3_head_config(
        head.cfg, verifier="v", verifier_arch="LlamaForCausalLM", num_speculative_tokens=2
    )
    layer = config["transformer_layer_config"]
    cfg = head.cfg
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["algorithm"] == "eagle3"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert config["draft_vocab_size"] == 50
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2]
    assert config["norm_before_residual"] is cfg.norm_before_residual
    assert config["target_hidden_size"] == cfg.target_hidden_size
    assert (layer["hidden_size"], layer["num_attention_heads"], layer["num_key_value_heads"]) == (
        cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
    )  # fmt: skip
    assert (layer["head_dim"], layer["intermediate_size"], layer["vocab_size"]) == (
        cfg.head_dim, cfg.intermediate_size, cfg.target_vocab_size,
    )  # fmt: skip
    path = tmp_path / "head"
    write_head(path, config, dict(head.state_dict()))
    loaded = load_eagle3(read_head_info(path), target.cfg, torch.float32)
    assert loaded.cfg == cfg
    assert loaded.fc.weight.shape == (cfg.hidden_size, 2 * cfg.target_hidden_size)


def test_medusa_head_round_trip(tmp_path: Path) -> None:
    target = make_tiny_model("llama")
    heads = make_medusa_heads(target, seed=2, num_heads=3)
    cfg = target.cfg
    tensors = {k: v.to(torch.bfloat16) for k, v in heads.state_dict().items()}
    # vLLM's Medusa loader needs the (shared) LM head in the directory; specserve ignores it.
    tensors["lm_heads.0.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size).bfloat16()
    config = medusa_head_config(heads.cfg, verifier="tiny-llama")
    path = tmp_path / "medusa"
    write_head(path, config, tensors)

    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert "lm_heads.0.weight" in set(f.keys())
    info = read_head_info(path)
    assert info.method == "medusa"
    assert info.verifier == "tiny-llama"
    assert info.config == config
    loaded = load_medusa(info, cfg, torch.bfloat16)
    assert loaded.cfg == heads.cfg
    got = loaded.state_dict()
    assert got.keys() == tensors.keys() - {"lm_heads.0.weight"}
    for key, value in got.items():
        assert torch.equal(value, tensors[key]), key


@pytest.mark.slow
def test_speculators_loads_our_eagle3_head(tmp_path: Path) -> None:
    """speculators 0.9.0 (a private install, in a subprocess) parses the config, loads every
    tensor bit-exactly and reads the same vocabulary map. Skipped only when the install
    cannot be made because the package index is unreachable."""
    script = _script()
    try:
        install = script["ensure_install"](INSTALL_DIR)
    except script["PyPIUnreachable"] as exc:
        pytest.skip(f"speculators cannot be installed, PyPI is unreachable: {exc}")
    head = script["write_tiny_head"](tmp_path / "tiny-eagle3")
    report = script["run_check"](head, install)
    assert not report["failed"], "speculators rejects our EAGLE-3 format:\n" + "\n".join(
        report["failed"]
    )
    assert report["ok"], report
    assert "speculators" not in sys.modules  # only the check's subprocess imports it
    checked = " ".join(report["passed"])
    for key in ("fc.weight", "layers.0.self_attn.q_proj.weight", "lm_head.weight", "d2t", "t2d"):
        assert f"tensor {key} " in checked, f"{key} was not compared"
