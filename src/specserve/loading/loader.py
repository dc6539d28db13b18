"""``load_model``: one entry point for catalog names, GGUF files, HF directories and repo ids."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from specserve.config import check_device
from specserve.loading import weight_cache
from specserve.loading.catalog import CATALOG
from specserve.loading.errors import ModelNotFoundError
from specserve.loading.gguf_loader import GGUFFile
from specserve.loading.hf_dir import hf_arch, hf_tokenizer, hub_snapshot, iter_hf_weights
from specserve.loading.memory import check_fits
from specserve.loading.tokenizer import Tokenizer
from specserve.loading.transport import fetch
from specserve.models.arch import ArchConfig, UnsupportedModelError
from specserve.models.decoder import DecoderLM
from specserve.models.native import bf16_native, fused_layer, huge_pages
from specserve.models.norm_rope import RotaryEmbedding

logger = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run.

    Attributes:
        model: the decoder, in eval mode, on the requested device and dtype.
        tokenizer: its tokenizer (special ids, generation EOS ids, chat template).
        arch: the architecture (``model.cfg``).
        name: the spec it was loaded from (catalog name, path or repo id).
        source: the file or directory the weights came from.
    """

    model: DecoderLM
    tokenizer: Tokenizer
    arch: ArchConfig
    name: str
    source: Path


def _offline_hint() -> str:
    return f"catalog names {sorted(CATALOG)}, a local .gguf file, or a local HF directory"


def build_model(
    arch: ArchConfig,
    weights: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    device: torch.device,
    mapped: bool = False,
) -> DecoderLM:
    """A DecoderLM whose parameters *are* the given tensors (no random init, no copy on CPU;
    on the native bf16 path, the streamed ones then move into huge pages unless ``mapped``).

    Raises UnsupportedModelError/ValueError when names or shapes do not match the architecture.
    """
    with torch.device("meta"):
        model = DecoderLM(arch)
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name not in expected:
            raise UnsupportedModelError(f"checkpoint tensor {name!r} has no place in the decoder")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(
                f"tensor {name!r} has shape {list(tensor.shape)}, the architecture expects "
                f"{list(expected[name].shape)}"
            )
        state[name] = tensor.to(device=device, dtype=dtype)
    if arch.tie_word_embeddings:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight"))  # type: ignore[arg-type]
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(
            f"checkpoint lacks tensors: {missing[:5]}{'...' if len(missing) > 5 else ''}"
        )
    model.load_state_dict(state, strict=True, assign=True)
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rotary = RotaryEmbedding(arch.head_dim, arch.rope_theta).to(device)
    # bf16 on CPU: one native op per layer where the model qualifies, its streamed weights in
    # huge pages (in place, values exact), as the quantised formats' packed weights are
    if fused_layer.enable(model) and not mapped:
        dense = [m.weight for m in model.model.modules() if type(m) is torch.nn.Linear]
        huge_pages.adopt_all(dense + ([model.lm_head.weight] if model.logits_runner else []))
    return model.requires_grad_(False).eval()


def _streamed_name(name: str) -> bool:
    """A tensor each decode step reads whole: a projection or the (untied) LM head."""
    return name.endswith("proj.weight") or name == "lm_head.weight"


def _cached_weights(
    wfile: Path, dtype: torch.dtype, device: torch.device, mapped: bool
) -> dict[str, torch.Tensor]:
    """The weight cache's tensors, memory-mapped; where the native bf16 path will stream them,
    the streamed ones read into huge pages instead (build_model would move them there: read
    in directly, the file's pages under them never count beside the copies)."""
    native = huge_pages.available() and bf16_native.available() and not mapped
    if device.type == "cpu" and dtype == torch.bfloat16 and native:
        return weight_cache.read_weights(wfile, huge_pages.empty, _streamed_name)
    return weight_cache.load_weights_mmap(wfile)


def _load_gguf(
    path: Path, name: str, dtype: torch.dtype, device: torch.device, mapped: bool
) -> LoadedModel:
    directory = weight_cache.cache_dir_for(path)
    wfile = weight_cache.weights_file(directory, dtype)
    with weight_cache.cache_lock(directory):
        if wfile.is_file():
            arch = weight_cache.load_arch(directory)
            check_fits(arch.num_params(), dtype, device, name)
            tokenizer = Tokenizer.load(directory / "tokenizer")
            weights = _cached_weights(wfile, dtype, device, mapped)
            logger.info("loading %s from the weight cache %s", name, wfile)
            model = build_model(arch, weights.items(), dtype, device, mapped)
            return LoadedModel(model, tokenizer, arch, name, path)
        fp32_file = weight_cache.weights_file(directory, torch.float32)
        if fp32_file.is_file():  # another dtype: cast the cached fp32 weights, no dequantising
            arch = weight_cache.load_arch(directory)
            check_fits(arch.num_params(), dtype, device, name)
            tokenizer = Tokenizer.load(directory / "tokenizer")
            fp32 = weight_cache.load_weights_mmap(fp32_file)
            state = {k: v.to(dtype) for k, v in fp32.items()}
            del fp32
            weight_cache.save_weights(wfile, state)
            model = build_model(arch, state.items(), dtype, device, mapped)
            return LoadedModel(model, tokenizer, arch, name, path)
        t0 = time.perf_counter()
        gguf = GGUFFile(path)
        gguf.check_supported()
        tokenizer = Tokenizer.from_gguf(gguf.tokenizer_data())
        arch = gguf.arch_config(tokenizer.bos_token_id, tokenizer.eos_token_ids)
        check_fits(arch.num_params(), dtype, device, name)
        state = dict(gguf.iter_weights(arch, dtype))
        logger.info("dequantised %s in %.1f s", path.name, time.perf_counter() - t0)
        weight_cache.save_arch(directory, arch)
        tokenizer.save(directory / "tokenizer")
        weight_cache.save_weights(wfile, state)
    model = build_model(arch, state.items(), dtype, device, mapped)
    return LoadedModel(model, tokenizer, arch, name, path)


def _load_hf_dir(
    path: Path, name: str, dtype: torch.dtype, device: torch.device, mapped: bool
) -> LoadedModel:
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
    tokenizer = hf_tokenizer(path)
    arch = hf_arch(path, tokenizer.eos_token_ids)
    check_fits(arch.num_params(), dtype, device, name)
    model = build_model(arch, iter_hf_weights(path, dtype), dtype, device, mapped)
    return LoadedModel(model, tokenizer, arch, name, path)


def _gguf_tokenizer(path: Path) -> Tokenizer:
    cached = weight_cache.cache_dir_for(path) / "tokenizer"
    if cached.is_dir():
        return Tokenizer.load(cached)
    gguf = GGUFFile(path)
    return Tokenizer.from_gguf(gguf.tokenizer_data())


def resolve_source(name: str) -> tuple[str, Path]:
    """Where a model spec points: (``gguf`` | ``hf``, path); catalog models are fetched and
    repo ids downloaded here."""
    if name in CATALOG:
        return "gguf", fetch(CATALOG[name])
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise UnsupportedModelError(f"{path} is a file but not a .gguf file")
        return "gguf", path
    if path.is_dir():
        return "hf", path
    looks_like_path = name.startswith((".", "/", "~")) or name.endswith(".gguf")
    if not looks_like_path and _REPO_ID.match(name):
        return "hf", hub_snapshot(name, _offline_hint())
    raise ModelNotFoundError(
        f"model {name!r} is neither a catalog name nor an existing path; try {_offline_hint()}"
    )


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """Only the tokenizer of a model named like :func:`load_model`'s ``spec`` (no weights
    are read: a GGUF's tokenizer comes from the cache or the file's metadata).

    Raises:
        the errors of :func:`load_model` that concern finding and reading the model.
    """
    kind, path = resolve_source(str(spec))
    return _gguf_tokenizer(path) if kind == "gguf" else hf_tokenizer(path)


def load_model(
    spec: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    mapped: bool = False,
) -> LoadedModel:
    """Load a model by catalog name, local ``.gguf`` file, local HF directory or HF repo id.

    Catalog models are fetched (and verified) on first use; GGUF weights are dequantised once
    and cached (``weight_cache.py``). Memory is checked before any weight is read. bf16
    weights that the native path streams each step are read into huge pages; ``mapped``
    leaves the weights where they come from (the weight cache's file mapped, read as
    touched), for a caller that replaces them (a quantised format).

    Raises:
        ModelNotFoundError: no such catalog name, path or repository.
        HubUnavailableError: a repo id was given and the hub cannot be reached.
        UnsupportedModelError: architecture, tensor type or tokenizer we cannot run.
        CorruptModelError: unreadable or truncated files.
        InsufficientMemoryError: the weights would not fit on ``device``.
        TransportError: a catalog download failed verification.
        ValueError: ``device`` is not one this process can use.
    """
    dev = check_device(device)
    weight_cache.dtype_name(dtype)  # validates the dtype early
    name = str(spec)
    kind, path = resolve_source(name)
    if kind == "gguf":
        return _load_gguf(path, name, dtype, dev, mapped)
    return _load_hf_dir(path, name, dtype, dev, mapped)
