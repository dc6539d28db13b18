"""Architecture description shared by every decoder family we run.

One dataclass covers Llama (SmolLM2), Qwen2/Qwen2.5 and Qwen3; the differences are flags
(``attention_bias``, ``qk_norm``, ``tie_word_embeddings``). It is built from a Hugging Face
``config.json`` dict or from GGUF metadata (see ``loading/gguf_loader.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# HF ``architectures`` value -> our family name.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class UnsupportedModelError(ValueError):
    """The model's architecture, quantisation or feature is not implemented (message names it)."""


@dataclass(frozen=True)
class ArchConfig:
    """Shapes and flags of a decoder-only transformer.

    Attributes:
        family: ``llama``, ``qwen2`` or ``qwen3``.
        vocab_size: rows of the embedding / LM head.
        hidden_size: model width.
        intermediate_size: SwiGLU inner width.
        num_layers: decoder blocks.
        num_heads: query heads.
        num_kv_heads: key/value heads (GQA when fewer than ``num_heads``).
        head_dim: width of one head.
        rope_theta: RoPE base.
        rms_norm_eps: RMSNorm epsilon.
        max_position_embeddings: the model's context limit.
        tie_word_embeddings: LM head shares the embedding matrix.
        attention_bias: q/k/v projections have a bias (Qwen2).
        qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
        bos_token_id: beginning-of-sequence id, if any.
        eos_token_ids: ids that end generation.
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in ("llama", "qwen2", "qwen3"):
            raise UnsupportedModelError(f"unsupported model family {self.family!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ArchConfig:
        """Build from a Hugging Face ``config.json`` dict; unsupported features raise."""
        archs = cfg.get("architectures") or []
        family = None
        for a in archs:
            family = SUPPORTED_ARCHITECTURES.get(a)
            if family:
                break
        if family is None:
            model_type = cfg.get("model_type")
            family = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(str(model_type))
        if family is None:
            raise UnsupportedModelError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (
            None,
            "default",
        ):
            raise UnsupportedModelError(f"unsupported rope_scaling {rope_scaling!r}")
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            family=family,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            rope_theta=float(
                cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
            ),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
        )

    def num_params(self) -> int:
        """Parameter count (used to check memory before loading)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.attention_bias else 0)
        mlp = 3 * h * i
        per_layer = attn + mlp + 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_layers * per_layer + h + head
