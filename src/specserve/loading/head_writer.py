"""Writing draft-head directories: the ``config.json`` of each format and an atomic write.

The formats are described in ``spec_heads.py``, which reads them back.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from specserve.loading.spec_heads import CONFIG_FILE, TRAINING_FILE, WEIGHTS_FILE
from specserve.models.eagle3 import Eagle3Config
from specserve.models.medusa import MedusaConfig


def eagle3_head_config(
    cfg: Eagle3Config, *, verifier: str, verifier_arch: str, num_speculative_tokens: int
) -> dict[str, Any]:
    """The ``config.json`` of an EAGLE-3 head in the ``speculators`` format."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "torch_dtype": "bfloat16",
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_output": cfg.norm_output,
        "norm_before_fc": False,
        "fc_norm": False,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "transformer_layer_config": {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
            "num_hidden_layers": 1,
            "vocab_size": cfg.target_vocab_size,
            "rope_theta": cfg.rope_theta,
            "rms_norm_eps": cfg.rms_norm_eps,
            "hidden_act": "silu",
            "attention_bias": cfg.attention_bias,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "max_position_embeddings": 32768,
        },
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": num_speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {"name_or_path": verifier, "architectures": [verifier_arch]},
        },
    }


def medusa_head_config(cfg: MedusaConfig, *, verifier: str) -> dict[str, Any]:
    """The ``config.json`` of Medusa heads as vLLM's Medusa loader reads it."""
    return {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "truncated_vocab_size": cfg.vocab_size,
        "num_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": True,
        "base_model_name_or_path": verifier,
    }


def write_head(
    path: Path,
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    training: dict[str, Any] | None = None,
) -> None:
    """Write a head directory atomically: into a sibling temporary directory first, renamed
    over ``path`` only when every file is complete (a full disk leaves ``path`` as it was).

    Raises:
        OSError: the directory cannot be written (the message names it); nothing is left.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        if training is not None:
            (tmp / TRAINING_FILE).write_text(json.dumps(training, indent=2) + "\n")
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            os.replace(path, old)
            os.replace(tmp, path)
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
        else:
            os.replace(tmp, path)
    except BaseException:
        for f in tmp.glob("*"):
            f.unlink()
        tmp.rmdir()
        raise
