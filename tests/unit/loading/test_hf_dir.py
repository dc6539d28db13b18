"""HF directories (sharded safetensors + tokenizer.json), repo ids offline, memory checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading import (
    CorruptModelError,
    HubUnavailableError,
    InsufficientMemoryError,
    ModelNotFoundError,
    UnsupportedModelError,
    load_model,
)
from specserve.loading.gguf_loader import GGUFFile
from specserve.loading.memory import check_fits
from specserve.loading.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")


def _save_hf_dir(tmp_path: Path, family: str, gguf_factory, shard: bool) -> tuple[Path, object]:  # type: ignore[no-untyped-def]
    gguf_path, model = gguf_factory(family)
    directory = tmp_path / f"hf-{family}"
    model.save_pretrained(directory, max_shard_size="40KB" if shard else "1GB")
    data = GGUFFile(gguf_path).tokenizer_data()
    Tokenizer.from_gguf(data).backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": None,
                "eos_token": {"content": "<|im_end|>"},
                "pad_token": "<|endoftext|>",
                "chat_template": data.chat_template,
            }
        )
    )
    return directory, model


@pytest.mark.parametrize(("family", "shard"), [("llama", True), ("qwen2", False), ("qwen3", True)])
def test_hf_directory_logits_match_transformers(tmp_path, gguf_factory, family, shard) -> None:
    directory, ref = _save_hf_dir(tmp_path, family, gguf_factory, shard)
    assert (directory / "model.safetensors.index.json").is_file() == shard
    lm = load_model(directory)
    ids = [1, 5, 260, 99, 7, 3, 250]
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]  # type: ignore[operator]
    cache = SingleSequenceCache(lm.model, 32)
    torch.testing.assert_close(lm.model.compute_logits(cache.forward(ids)), expected)
    assert lm.tokenizer.eos_token_id == lm.tokenizer.token_to_id("<|im_end|>")
    assert lm.tokenizer.apply_chat_template([{"role": "user", "content": "x"}]).endswith(
        "assistant\n"
    )


def test_generation_config_eos_ids_win(tmp_path, gguf_factory) -> None:
    directory, _ = _save_hf_dir(tmp_path, "qwen2", gguf_factory, shard=False)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [264, 263]}))
    lm = load_model(directory)
    assert lm.tokenizer.eos_token_ids == (264, 263) == lm.arch.eos_token_ids


def test_missing_shard_and_missing_tokenizer_are_clear(tmp_path, gguf_factory) -> None:
    directory, _ = _save_hf_dir(tmp_path, "llama", gguf_factory, shard=True)
    next(directory.glob("model-0000*-of-*.safetensors")).unlink()
    with pytest.raises(CorruptModelError, match="missing"):
        load_model(directory)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(CorruptModelError, match=r"tokenizer\.json"):
        load_model(directory)


def test_corrupt_safetensors_shard_is_reported(tmp_path, gguf_factory) -> None:
    directory, _ = _save_hf_dir(tmp_path, "qwen2", gguf_factory, shard=False)
    (directory / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CorruptModelError, match="safetensors"):
        load_model(directory)


def test_directory_without_config_and_bin_only(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        load_model(tmp_path / "empty")
    with pytest.raises(UnsupportedModelError, match=r"not a \.gguf"):
        (tmp_path / "weights.bin").write_bytes(b"x")
        load_model(tmp_path / "weights.bin")


def test_repo_id_offline_names_the_alternatives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    with pytest.raises(HubUnavailableError, match="smollm2-135m-instruct") as info:
        load_model("SomeOrg/some-model-that-is-not-cached")
    assert "local .gguf file" in str(info.value)


@pytest.mark.parametrize("spec", ["not-a-model", "./missing/dir", "~/nope.gguf", "a/b/c"])
def test_unknown_spec_is_model_not_found(spec: str) -> None:
    with pytest.raises(ModelNotFoundError, match="catalog"):
        load_model(spec)


def test_check_fits() -> None:
    cpu = torch.device("cpu")
    assert check_fits(1000, torch.float32, cpu, "m", available=1 << 30) == 4000
    with pytest.raises(InsufficientMemoryError, match=r"m needs 3\.73 GiB"):
        check_fits(1_000_000_000, torch.float32, cpu, "m", available=2 << 30)
    check_fits(1_000_000_000, torch.bfloat16, cpu, "m", available=3 << 30)  # bf16 halves it
