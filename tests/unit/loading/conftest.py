"""Tiny GGUF files written the way llama.cpp's converter writes them, from tiny HF models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

transformers = pytest.importorskip("transformers")

HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}
PRE_TOKENIZER = {"llama": "smollm", "qwen2": "qwen2", "qwen3": "qwen2"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ġ Ġ"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def byte_tokens() -> list[str]:
    """The 256 byte-level BPE base tokens, in byte order (GPT-2's byte -> char table)."""
    from specserve.loading.tokenizer import _bytes_to_unicode

    table = _bytes_to_unicode()
    return [table[b] for b in range(256)]


def tiny_vocab() -> list[str]:
    merged = ["".join(m.split(" ")) for m in MERGES]
    return byte_tokens() + merged + SPECIALS


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    parts = hf_name.split(".")
    return f"blk.{parts[2]}.{LAYER_TO_GGUF['.'.join(parts[3:])]}"


def permute_like_llama_cpp(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter layout for llama q/k rows (the inverse of what we undo)."""
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tiny_hf_model(family: str, seed: int = 0, vocab_size: int | None = None) -> Any:
    cfg_name, model_name = HF_CLASSES[family]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_name)(
        vocab_size=vocab_size or len(tiny_vocab()),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        # transformers' GGUF reader ignores qwen3's key_length and assumes head_dim 128.
        head_dim=128 if family == "qwen3" else 16,
        max_position_embeddings=128,
        rope_theta=5000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=family != "llama",
    )
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2 if p.dim() == 2 else 0.05).add_(1.0 if p.dim() == 1 else 0.0)
    return model


def write_gguf(
    path: Path,
    hf_model: Any,
    family: str,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    arch_name: str | None = None,
    metadata_overrides: dict[str, Any] | None = None,
    raw_tensor: tuple[str, GGMLQuantizationType] | None = None,
    tensor_types: dict[str, GGMLQuantizationType] | None = None,
) -> Path:
    """Write ``hf_model`` as a llama.cpp-style GGUF: 2-D weights in ``qtype``, norms in F32;
    ``tensor_types`` maps a GGUF name suffix (``attn_v.weight``) to another type for those
    tensors, as llama.cpp's mixes (Q4_K_M) do."""
    cfg = hf_model.config
    arch = arch_name or family
    w = GGUFWriter(str(path), arch)
    meta = {
        "block_count": cfg.num_hidden_layers,
        "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size,
        "feed_forward_length": cfg.intermediate_size,
        "head_count": cfg.num_attention_heads,
        "head_count_kv": cfg.num_key_value_heads,
        "rope_freq_base": cfg.rope_theta if hasattr(cfg, "rope_theta") else 5000.0,
        "layer_norm_rms_eps": cfg.rms_norm_eps,
        "key_length": cfg.head_dim,
        "value_length": cfg.head_dim,
    }
    meta.update(metadata_overrides or {})
    for key, value in meta.items():
        getattr(w, f"add_{key}")(value)
    tokens = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(PRE_TOKENIZER[family])
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    tied = cfg.tie_word_embeddings
    for name, tensor in hf_model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        arr = tensor.detach().float().numpy().copy()
        if family == "llama" and name.endswith("q_proj.weight"):
            arr = permute_like_llama_cpp(arr, cfg.num_attention_heads)
        elif family == "llama" and name.endswith("k_proj.weight"):
            arr = permute_like_llama_cpp(arr, cfg.num_key_value_heads)
        gname = gguf_name(name)
        if raw_tensor is not None and gname == raw_tensor[0]:
            # Arbitrary bytes of the right size for a type we do not dequantise.
            from gguf.constants import GGML_QUANT_SIZES

            block, size = GGML_QUANT_SIZES[raw_tensor[1]]
            raw = np.zeros((arr.shape[0], arr.shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=raw_tensor[1])
        elif arr.ndim == 2 and qtype != GGMLQuantizationType.F32:
            own = next(
                (t for suffix, t in (tensor_types or {}).items() if gname.endswith(suffix)), qtype
            )
            w.add_tensor(gname, quantize(arr, own), raw_dtype=own)
        else:
            w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every loading unit test gets its own $SPECSERVE_CACHE_DIR."""
    cache = tmp_path / "specserve-cache"
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def gguf_factory(tmp_path: Path) -> Callable[..., tuple[Path, Any]]:
    """``make(family, qtype=..., **kw) -> (gguf path, hf model)``."""
    counter = iter(range(1000))

    def make(family: str, qtype: GGMLQuantizationType = GGMLQuantizationType.F32, **kw: Any):  # type: ignore[no-untyped-def]
        model = tiny_hf_model(family, seed=kw.pop("seed", 0))
        path = tmp_path / f"m{next(counter)}" / f"tiny-{family}-{qtype.name}.gguf"
        path.parent.mkdir(parents=True)
        return write_gguf(path, model, family, qtype, **kw), model

    return make
