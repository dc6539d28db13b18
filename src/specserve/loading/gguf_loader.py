"""Read a GGUF file: architecture from its metadata, weights dequantised onto our names.

GGUF (llama.cpp's format) stores tensors under its own names (``blk.3.attn_q.weight``), often
block-quantised (Q4_K, Q6_K, Q8_0, ...). We dequantise with ``gguf.quants.dequantize`` to fp32
and rename onto the Hugging Face names our decoder uses. One catch: for the ``llama``
architecture llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` so that RoPE can
rotate adjacent pairs (interleaved layout); our decoder uses the "rotate half" layout of HF
checkpoints, so those rows are permuted back (``_unpermute_rope_rows``). Qwen2/Qwen3 files are
written without that permutation.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from specserve.loading.errors import CorruptModelError, ModelNotFoundError
from specserve.models.arch import ArchConfig, UnsupportedModelError

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")

Q = GGMLQuantizationType
SUPPORTED_TENSOR_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0}
    | {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)

# llama.cpp tensor name -> our (HF) name; ``{i}`` is the layer index.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_name(gguf_name: str) -> str:
    """Our parameter name for a llama.cpp tensor name; unknown names raise."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise UnsupportedModelError(f"GGUF tensor {gguf_name!r} has no counterpart in our decoder")


def _unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves).

    The converter maps each head's rows ``(2, hd/2)`` -> ``(hd/2, 2)``; we map them back.
    ``w # [num_heads * head_dim, ...]`` (weight rows or bias entries).
    """
    rows = w.shape[0]
    half = rows // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass(frozen=True)
class GGUFTokenizerData:
    """The tokenizer a GGUF file describes (``tokenizer.*`` metadata keys).

    Attributes:
        model: ``tokenizer.ggml.model`` (``gpt2`` = byte-level BPE).
        pre: ``tokenizer.ggml.pre``, the pre-tokenizer name (``qwen2``, ``smollm``, ...).
        tokens: the vocabulary, by id.
        token_types: llama.cpp token types by id (1 normal, 3 control, 4 user-defined, ...).
        merges: BPE merges, ``"a b"`` strings in priority order.
        bos_token_id / eos_token_id / pad_token_id / unk_token_id: special ids, if set.
        add_bos_token / add_eos_token: whether encoding adds BOS / EOS.
        chat_template: the Jinja chat template, if any.
    """

    model: str
    pre: str | None
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    unk_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    chat_template: str | None


class GGUFFile:
    """A parsed GGUF file (memory-mapped; tensors are read lazily)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelNotFoundError(f"GGUF file {str(self.path)!r} does not exist")
        try:
            self.reader = GGUFReader(self.path)
        except (ValueError, IndexError, KeyError, EOFError, struct.error, OSError) as e:
            raise CorruptModelError(
                f"{self.path.name} is not a readable GGUF file (truncated or corrupt?): {e}"
            ) from e
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.architecture = str(self.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value ``key`` (scalars as Python values, arrays as lists)."""
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def _arch_key(self, key: str, default: Any = None) -> Any:
        return self.get(f"{self.architecture}.{key}", default)

    def check_supported(self) -> None:
        """Raise UnsupportedModelError for anything we cannot run, before any dequantising."""
        if self.architecture not in SUPPORTED_GGUF_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported GGUF architecture {self.architecture!r} in {self.path.name}; "
                f"supported: {list(SUPPORTED_GGUF_ARCHITECTURES)}"
            )
        scaling = self._arch_key("rope.scaling.type")
        if scaling not in (None, "none"):
            raise UnsupportedModelError(f"unsupported RoPE scaling {scaling!r} in {self.path.name}")
        for t in self.reader.tensors:
            if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
                raise UnsupportedModelError(
                    f"unsupported GGUF tensor type {t.tensor_type.name} (tensor {t.name!r}) in "
                    f"{self.path.name}; supported: {sorted(q.name for q in SUPPORTED_TENSOR_TYPES)}"
                )
            hf_name(t.name)
        if "token_embd.weight" not in self.tensors:
            raise CorruptModelError(f"{self.path.name} has no token_embd.weight tensor")

    def tokenizer_data(self) -> GGUFTokenizerData:
        model = self.get("tokenizer.ggml.model")
        if model is None:
            raise UnsupportedModelError(f"{self.path.name} carries no tokenizer")
        tokens = [str(t) for t in self.get("tokenizer.ggml.tokens", [])]
        types = [int(t) for t in self.get("tokenizer.ggml.token_type", [1] * len(tokens))]

        def opt_int(key: str) -> int | None:
            v = self.get(key)
            return None if v is None else int(v)

        return GGUFTokenizerData(
            model=str(model),
            pre=self.get("tokenizer.ggml.pre"),
            tokens=tokens,
            token_types=types,
            merges=[str(m) for m in self.get("tokenizer.ggml.merges", [])],
            bos_token_id=opt_int("tokenizer.ggml.bos_token_id"),
            eos_token_id=opt_int("tokenizer.ggml.eos_token_id"),
            pad_token_id=opt_int("tokenizer.ggml.padding_token_id"),
            unk_token_id=opt_int("tokenizer.ggml.unknown_token_id"),
            add_bos_token=bool(self.get("tokenizer.ggml.add_bos_token", False)),
            add_eos_token=bool(self.get("tokenizer.ggml.add_eos_token", False)),
            chat_template=self.get("tokenizer.chat_template"),
        )

    def arch_config(
        self, bos_token_id: int | None = None, eos_token_ids: tuple[int, ...] = ()
    ) -> ArchConfig:
        """The architecture described by the metadata (call ``check_supported`` first)."""

        def need(key: str) -> Any:
            v = self._arch_key(key)
            if v is None:
                raise CorruptModelError(
                    f"{self.path.name} lacks metadata {self.architecture}.{key}"
                )
            return v

        hidden = int(need("embedding_length"))
        num_heads = int(need("attention.head_count"))
        head_dim = int(self._arch_key("attention.key_length") or hidden // num_heads)
        rope_dim = self._arch_key("rope.dimension_count")
        if rope_dim is not None and int(rope_dim) != head_dim:
            raise UnsupportedModelError(
                f"partial rotary embedding (rope.dimension_count {rope_dim} != head_dim "
                f"{head_dim}) in {self.path.name}"
            )
        embd = self.tensors["token_embd.weight"]
        return ArchConfig(
            family=self.architecture,
            vocab_size=int(embd.shape[-1]),  # GGUF shapes are [in, out]: [hidden, vocab]
            hidden_size=hidden,
            intermediate_size=int(need("feed_forward_length")),
            num_layers=int(need("block_count")),
            num_heads=num_heads,
            num_kv_heads=int(self._arch_key("attention.head_count_kv") or num_heads),
            head_dim=head_dim,
            rope_theta=float(self._arch_key("rope.freq_base", 10000.0)),
            rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(self._arch_key("context_length", 4096)),
            tie_word_embeddings="output.weight" not in self.tensors,
            attention_bias="blk.0.attn_q.bias" in self.tensors,
            qk_norm="blk.0.attn_q_norm.weight" in self.tensors,
            bos_token_id=bos_token_id,
            eos_token_ids=eos_token_ids,
        )

    def iter_weights(
        self, arch: ArchConfig, dtype: torch.dtype
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(our name, tensor)`` for every tensor, dequantised to fp32 then cast to
        ``dtype`` one tensor at a time (peak memory: the result plus one fp32 tensor)."""
        for t in self.reader.tensors:
            name = hf_name(t.name)
            expected = tuple(int(d) for d in reversed(t.shape.tolist()))
            try:
                w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
                w = w.reshape(expected)
            except ValueError as e:
                raise CorruptModelError(
                    f"tensor {t.name!r} of {self.path.name} cannot be read as "
                    f"{t.tensor_type.name} {list(expected)} (truncated file?): {e}"
                ) from e
            if self.architecture == "llama":
                if t.name.endswith((".attn_q.weight", ".attn_q.bias")):
                    w = _unpermute_rope_rows(w, arch.num_heads)
                elif t.name.endswith((".attn_k.weight", ".attn_k.bias")):
                    w = _unpermute_rope_rows(w, arch.num_kv_heads)
            if not (w.flags.writeable and w.flags.c_contiguous):
                w = np.array(w, dtype=np.float32, copy=True)  # e.g. F32 views of the mmap
            yield name, torch.from_numpy(w).to(dtype)
