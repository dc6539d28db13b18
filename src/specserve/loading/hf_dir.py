"""Hugging Face model directories (``config.json`` + safetensors + tokenizer) and repo ids."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer as BackendTokenizer

from specserve.loading.errors import CorruptModelError, HubUnavailableError, ModelNotFoundError
from specserve.loading.tokenizer import Tokenizer
from specserve.models.arch import ArchConfig, UnsupportedModelError

# Checkpoint entries our decoder recomputes instead of loading.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CorruptModelError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise CorruptModelError(f"{path} must hold a JSON object")
    return data


def _shards(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map") or {}
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise CorruptModelError(
                f"{directory}: shards listed in the index are missing: {missing}"
            )
        return [directory / n for n in names]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    if any(directory.glob("*.bin")):
        raise UnsupportedModelError(
            f"{directory} has only PyTorch .bin weights; convert them to safetensors"
        )
    raise CorruptModelError(f"{directory} has no model.safetensors(.index.json)")


def hf_arch(directory: Path, eos_token_ids: tuple[int, ...]) -> ArchConfig:
    cfg = _read_json(directory / "config.json")
    arch = ArchConfig.from_hf_config(cfg)
    if eos_token_ids:
        arch = ArchConfig(**{**arch.__dict__, "eos_token_ids": eos_token_ids})
    return arch


def iter_hf_weights(directory: Path, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every checkpoint tensor, cast to ``dtype``."""
    for shard in _shards(directory):
        try:
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if name.endswith(_IGNORED_SUFFIXES):
                        continue
                    yield name, f.get_tensor(name).to(dtype)
        except (OSError, RuntimeError, SafetensorError) as e:
            raise CorruptModelError(f"cannot read safetensors shard {shard}: {e}") from e


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def hf_tokenizer(directory: Path) -> Tokenizer:
    """The tokenizer of an HF directory: ``tokenizer.json`` + ``tokenizer_config.json``
    (special tokens, chat template; or ``chat_template.jinja``) + ``generation_config.json``
    (generation EOS ids, when present)."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CorruptModelError(f"{directory} has no tokenizer.json")
    backend = BackendTokenizer.from_file(str(path))
    cfg_path = directory / "tokenizer_config.json"
    tcfg = _read_json(cfg_path) if cfg_path.is_file() else {}
    template = tcfg.get("chat_template")
    jinja = directory / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text()
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)

    def tid(key: str) -> int | None:
        content = _token_content(tcfg.get(key))
        return None if content is None else backend.token_to_id(content)

    eos_ids: list[int] | None = None
    gen_path = directory / "generation_config.json"
    if gen_path.is_file():
        eos = _read_json(gen_path).get("eos_token_id")
        if eos is not None:
            eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    return Tokenizer(
        backend,
        bos_token_id=tid("bos_token"),
        eos_token_id=tid("eos_token"),
        pad_token_id=tid("pad_token"),
        eos_token_ids=eos_ids,
        chat_template=template,
    )


def hub_snapshot(repo_id: str, offline_hint: str) -> Path:
    """Download (or find in the HF cache) ``repo_id``; HubUnavailableError when unreachable."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        path = snapshot_download(
            repo_id,
            allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer*"],
            local_files_only=offline,
        )
    except (LocalEntryNotFoundError, OSError, HfHubHTTPError) as e:
        if isinstance(e, HfHubHTTPError) and getattr(e.response, "status_code", None) == 404:
            raise ModelNotFoundError(f"no model repository {repo_id!r} on the hub") from e
        raise HubUnavailableError(
            f"cannot download {repo_id!r}: the Hugging Face hub is unreachable ({e}). "
            f"Offline alternatives: {offline_hint}"
        ) from e
    return Path(path)
