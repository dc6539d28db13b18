"""Head directories: finding a head by name, and every way a head can be wrong is a clear
error (missing files, unreadable config, unknown format, a head for another target, missing
or misshapen tensors, options specserve does not implement); writing is atomic."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from specserve.engine.builder import load_head
from specserve.loading.errors import CorruptModelError, ModelNotFoundError
from specserve.loading.head_writer import eagle3_head_config, medusa_head_config, write_head
from specserve.loading.spec_heads import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    HeadMismatchError,
    heads_dir,
    read_head_info,
    resolve_head,
)
from tests.conftest import make_tiny_model
from tests.heads import make_eagle_head, make_medusa_heads


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def write_eagle(path: Path, target_seed: int = 0, **overrides: object) -> None:
    target = make_tiny_model("llama", seed=target_seed)
    head = make_eagle_head(target, draft_vocab_size=50)
    config = eagle3_head_config(head.cfg, verifier="tiny", verifier_arch="LlamaForCausalLM",
                                num_speculative_tokens=3)  # fmt: skip
    config.update(overrides)
    write_head(path, config, dict(head.state_dict()))


def test_a_trained_head_is_found_by_name_or_path(tmp_path: Path) -> None:
    write_eagle(heads_dir() / "mine")
    assert resolve_head("mine") == heads_dir() / "mine"
    assert resolve_head(str(heads_dir() / "mine")) == heads_dir() / "mine"
    with pytest.raises(ModelNotFoundError, match=r"no draft head 'other'.*known: mine"):
        resolve_head("other")
    info = read_head_info(resolve_head("mine"))
    assert info.method == "eagle" and info.verifier == "tiny"


@pytest.mark.parametrize(
    ("break_it", "error", "message"),
    [
        (lambda d: (d / CONFIG_FILE).unlink(), ModelNotFoundError, "config.json is missing"),
        (lambda d: (d / WEIGHTS_FILE).unlink(), ModelNotFoundError, "model.safetensors is missing"),
        (lambda d: (d / CONFIG_FILE).write_text("{oops"), CorruptModelError, "is not JSON"),
        (lambda d: (d / CONFIG_FILE).write_text("[1]"), CorruptModelError, "not a JSON object"),
        (lambda d: (d / CONFIG_FILE).write_text('{"architectures": ["X"]}'), CorruptModelError,
         "neither an EAGLE-3 head"),
        (lambda d: (d / WEIGHTS_FILE).write_bytes(b"\x00" * 16), CorruptModelError,
         "model.safetensors"),
    ],
)  # fmt: skip
def test_broken_head_directories(tmp_path: Path, break_it, error, message) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "h"
    write_eagle(path)
    break_it(path)
    target = make_tiny_model("llama")
    with pytest.raises(error, match=message):
        load_head("eagle", str(path), target, "cpu")


def test_a_head_for_another_target_names_both_values(tmp_path: Path) -> None:
    path = tmp_path / "h"
    write_eagle(path)
    with pytest.raises(HeadMismatchError, match="target vocabulary is 97, the target's is 120"):
        load_head("eagle", str(path), make_tiny_model("llama", vocab_size=120), "cpu")
    with pytest.raises(HeadMismatchError, match="is a eagle head; --spec-method is medusa"):
        load_head("medusa", str(path), make_tiny_model("llama"), "cpu")
    ids = tmp_path / "ids"
    write_eagle(ids, eagle_aux_hidden_state_layer_ids=[0, 9])
    with pytest.raises(HeadMismatchError, match="reads target hidden state 9"):
        load_head("eagle", str(ids), make_tiny_model("llama"), "cpu")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"norm_before_fc": True}, "does not implement norm_before_fc"),
        ({"fc_norm": True}, "does not implement fc_norm"),
        ({"draft_vocab_size": 51}, "d2t has shape"),
        ({"transformer_layer_config": None}, "has no 'transformer_layer_config'"),
    ],
)
def test_unsupported_or_inconsistent_configs(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    path = tmp_path / "h"
    write_eagle(path, **overrides)
    with pytest.raises(CorruptModelError, match=message):
        load_head("eagle", str(path), make_tiny_model("llama"), "cpu")


def test_missing_tensors_and_foreign_medusa_heads(tmp_path: Path) -> None:
    target = make_tiny_model("qwen2")
    heads = make_medusa_heads(target, num_heads=2)
    tensors = dict(heads.state_dict())
    del tensors["blocks.1.layers.0.bias"]
    write_head(tmp_path / "m", medusa_head_config(heads.cfg, verifier="tiny"), tensors)
    with pytest.raises(CorruptModelError, match=r"lacks blocks\.1\.layers\.0\.bias"):
        load_head("medusa", str(tmp_path / "m"), target, "cpu")
    own_lm = medusa_head_config(heads.cfg, verifier="tiny") | {"original_lm_head": False}
    write_head(tmp_path / "f", own_lm, dict(heads.state_dict()))
    with pytest.raises(CorruptModelError, match="share the target's LM head"):
        load_head("medusa", str(tmp_path / "f"), target, "cpu")


def test_write_is_atomic_when_the_disk_fills(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "h"
    write_eagle(path)
    before = {f.name: f.read_bytes() for f in path.iterdir()}
    import specserve.loading.head_writer as head_writer

    def full(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        Path(filename).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(head_writer, "save_file", full)
    with pytest.raises(OSError, match="No space left"):
        write_eagle(path, target_seed=1)
    assert {f.name: f.read_bytes() for f in path.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["h"]  # no temporary left beside it
    assert json.loads((path / CONFIG_FILE).read_text())["draft_vocab_size"] == 50
    assert torch.is_tensor(load_head("eagle", str(path), make_tiny_model("llama"), "cpu").d2t)
