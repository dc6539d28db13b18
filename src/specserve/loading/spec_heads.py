"""Draft heads on disk: EAGLE-3 in the ``speculators`` format, Medusa in vLLM's.

A head directory holds ``config.json`` and ``model.safetensors``:

- **EAGLE-3** (``speculators_model_type: eagle3``): the ``speculators`` package's
  ``Eagle3SpeculatorConfig`` fields (``transformer_layer_config`` for the head's one layer,
  ``draft_vocab_size``, ``norm_before_residual``, ``target_hidden_size``,
  ``eagle_aux_hidden_state_layer_ids`` and the ``speculators_config`` block naming the
  algorithm, proposal method and verifier), tensors named as :mod:`specserve.models.eagle3`
  names them. vLLM loads such a directory with ``"method": "eagle3"``.
- **Medusa** (``architectures: ["MedusaModel"]``): the config vLLM's Medusa loader reads
  (``hidden_size``, ``vocab_size``, ``num_heads``, ``num_hidden_layers``,
  ``medusa_fc_bias: true``, ``original_lm_head: true``), tensors
  ``blocks.{i}.layers.{j}.weight/bias`` and ``lm_heads.0.weight``: a copy of the target's LM
  head, which vLLM needs in the directory (vLLM's Medusa shares one LM head among the heads
  when ``original_lm_head`` is set; specserve reads the target's own and ignores the copy).
  vLLM has Medusa up to 0.28; later releases dropped the method.

Heads a user trained live in ``$SPECSERVE_CACHE_DIR/heads/<name>/`` (``specserve
train-draft`` writes there by default) and are named by that name or by any directory path.
Every load checks the head against its target: hidden size, vocabulary and layer ids, a
mismatch is a :class:`HeadMismatchError` naming both values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specserve.loading.errors import CorruptModelError, ModelNotFoundError
from specserve.models.arch import ArchConfig
from specserve.models.eagle3 import Eagle3Config, Eagle3Head
from specserve.models.medusa import MedusaConfig, MedusaHeads
from specserve.paths import cache_root

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# What specserve records about how a head was made (method, target, data, command).
TRAINING_FILE = "training.json"


class HeadMismatchError(ValueError):
    """A draft head that does not fit the target (the message names both values)."""


def heads_dir() -> Path:
    """Where trained heads are kept by name (created on first use)."""
    path = cache_root() / "heads"
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_head_fits(what: str, head_value: object, target_value: object, head: str) -> None:
    """Raise :class:`HeadMismatchError` unless the head's ``what`` equals the target's."""
    if head_value != target_value:
        raise HeadMismatchError(
            f"draft head {head} does not fit the target: its {what} is {head_value}, "
            f"the target's is {target_value}"
        )


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high target layers: vLLM's default (2, n // 2, n - 3) where
    those are three distinct layers (n >= 7); below that the input of layer 0, of layer
    n // 2 and the final output (id n), so that small targets can carry a head too.

    Raises:
        ValueError: a target of fewer than two layers.
    """
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    if num_layers < 2:
        raise ValueError(f"an EAGLE-3 head needs a target of >= 2 layers, not {num_layers}")
    return (0, num_layers // 2, num_layers)


@dataclass(frozen=True)
class HeadInfo:
    """What a head directory says about itself.

    Attributes:
        path: the directory.
        method: ``eagle`` or ``medusa``.
        config: its ``config.json``.
        training: its ``training.json`` (how specserve trained it), or None.
    """

    path: Path
    method: str
    config: dict[str, Any]
    training: dict[str, Any] | None

    @property
    def verifier(self) -> str | None:
        """The target the head was trained for, as the head names it."""
        if self.method == "eagle":
            spec = self.config.get("speculators_config") or {}
            return (spec.get("verifier") or {}).get("name_or_path")
        return self.config.get("base_model_name_or_path")


def resolve_head(spec: str) -> Path:
    """A head directory from a path or the name of a head in :func:`heads_dir`.

    Raises:
        ModelNotFoundError: neither exists (the message lists the known head names).
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    named = heads_dir() / spec
    if "/" not in spec and named.is_dir():
        return named
    known = ", ".join(sorted(p.name for p in heads_dir().iterdir() if p.is_dir())) or "none"
    raise ModelNotFoundError(
        f"no draft head {spec!r}: not a directory and not a trained head's name (known: "
        f"{known}); `specserve train-draft` trains one"
    )


def read_head_info(path: Path) -> HeadInfo:
    """Read and check a head directory's config.

    Raises:
        ModelNotFoundError: ``config.json`` or ``model.safetensors`` is missing.
        CorruptModelError: the config is not JSON or names no head format we load.
    """
    config_path, weights = path / CONFIG_FILE, path / WEIGHTS_FILE
    for needed in (config_path, weights):
        if not needed.is_file():
            raise ModelNotFoundError(f"draft head {path}: {needed.name} is missing")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptModelError(f"draft head {path}: {CONFIG_FILE} is not JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise CorruptModelError(f"draft head {path}: {CONFIG_FILE} is not a JSON object")
    if config.get("speculators_model_type") == "eagle3":
        method = "eagle"
    elif "MedusaModel" in (config.get("architectures") or []):
        method = "medusa"
    else:
        raise CorruptModelError(
            f"draft head {path}: {CONFIG_FILE} is neither an EAGLE-3 head "
            "(speculators_model_type: eagle3) nor Medusa heads (architectures: MedusaModel)"
        )
    training = None
    if (path / TRAINING_FILE).is_file():
        try:
            training = json.loads((path / TRAINING_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            training = None
    return HeadInfo(path, method, config, training)


def _field(config: dict[str, Any], key: str, path: Path) -> Any:
    if key not in config or config[key] is None:
        raise CorruptModelError(f"draft head {path}: {CONFIG_FILE} has no {key!r}")
    return config[key]


def eagle3_config(info: HeadInfo, target: ArchConfig, own_embedding: bool = False) -> Eagle3Config:
    """The head's shapes from its config; fields a public head may leave out (target hidden
    size, aux layer ids) default to the target's, as vLLM does. ``own_embedding``: the
    weights ship ``embed_tokens``."""
    cfg, path = info.config, info.path
    layer = _field(cfg, "transformer_layer_config", path)
    if not isinstance(layer, dict):
        raise CorruptModelError(f"draft head {path}: transformer_layer_config is not an object")
    unsupported = [key for key in ("norm_before_fc", "fc_norm") if cfg.get(key)]
    if layer.get("model_type", "llama") != "llama":
        unsupported.append(f"a {layer.get('model_type')} layer (only llama layers)")
    if int(layer.get("num_hidden_layers") or 1) != 1:
        unsupported.append(f"{layer['num_hidden_layers']} layers (only one)")
    if unsupported:
        raise CorruptModelError(
            f"draft head {path}: specserve's EAGLE-3 head does not implement "
            f"{', '.join(unsupported)}"
        )
    hidden = int(_field(layer, "hidden_size", path))
    heads = int(_field(layer, "num_attention_heads", path))
    aux = cfg.get("eagle_aux_hidden_state_layer_ids") or default_aux_layer_ids(target.num_layers)
    try:
        return Eagle3Config(
            hidden_size=hidden,
            intermediate_size=int(_field(layer, "intermediate_size", path)),
            num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            target_hidden_size=int(cfg.get("target_hidden_size") or target.hidden_size),
            aux_layer_ids=tuple(int(i) for i in aux),
            target_vocab_size=int(_field(layer, "vocab_size", path)),
            draft_vocab_size=int(_field(cfg, "draft_vocab_size", path)),
            rope_theta=float(layer.get("rope_theta") or 10000.0),
            rms_norm_eps=float(layer.get("rms_norm_eps") or 1e-6),
            # vLLM reads a missing key as True (speculators' default is False; heads it
            # writes always carry the key).
            norm_before_residual=bool(cfg.get("norm_before_residual", True)),
            norm_output=bool(cfg.get("norm_output", False)),
            attention_bias=bool(layer.get("attention_bias", False)),
            own_embedding=own_embedding,
        )
    except (TypeError, ValueError) as exc:
        raise CorruptModelError(f"draft head {path}: {exc}") from exc


def medusa_config(info: HeadInfo) -> MedusaConfig:
    """Medusa heads' shapes (FasterDecoding's ``medusa_num_heads`` / ``medusa_num_layers``
    spellings accepted, as vLLM accepts them).

    Raises:
        CorruptModelError: heads with LM heads of their own (specserve's share the target's)
            or without a bias on their blocks.
    """
    cfg, path = info.config, info.path
    if not cfg.get("original_lm_head", False) or not cfg.get("medusa_fc_bias", False):
        raise CorruptModelError(
            f"draft head {path}: specserve's Medusa heads share the target's LM head "
            "(original_lm_head: true) and have biased blocks (medusa_fc_bias: true); these "
            "heads do not"
        )
    try:
        return MedusaConfig(
            hidden_size=int(_field(cfg, "hidden_size", path)),
            vocab_size=int(_field(cfg, "vocab_size", path)),
            num_heads=int(cfg.get("num_heads") or _field(cfg, "medusa_num_heads", path)),
            num_layers=int(cfg.get("num_hidden_layers") or cfg.get("medusa_num_layers") or 1),
        )
    except (TypeError, ValueError) as exc:
        raise CorruptModelError(f"draft head {path}: {exc}") from exc


def check_eagle3_fits(cfg: Eagle3Config, target: ArchConfig, name: str) -> None:
    check_head_fits("target hidden size", cfg.target_hidden_size, target.hidden_size, name)
    check_head_fits("target vocabulary", cfg.target_vocab_size, target.vocab_size, name)
    for layer_id in cfg.aux_layer_ids:
        if not 0 <= layer_id <= target.num_layers:
            raise HeadMismatchError(
                f"draft head {name} reads target hidden state {layer_id}, but the target has "
                f"{target.num_layers} layers (hidden states 0..{target.num_layers})"
            )


def check_medusa_fits(cfg: MedusaConfig, target: ArchConfig, name: str) -> None:
    check_head_fits("hidden size", cfg.hidden_size, target.hidden_size, name)
    check_head_fits("vocabulary", cfg.vocab_size, target.vocab_size, name)


def _tensors(info: HeadInfo) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(info.path / WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise CorruptModelError(f"draft head {info.path}: {WEIGHTS_FILE}: {exc}") from exc


def _load_state(module: torch.nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Copy ``tensors`` into ``module``; tensors it does not have (the embedding, vLLM's
    shared LM head) are ignored, a missing or misshapen one is an error."""
    own = module.state_dict()
    missing = sorted(set(own) - set(tensors))
    if missing:
        raise CorruptModelError(f"draft head {path}: {WEIGHTS_FILE} lacks {', '.join(missing)}")
    for key, value in own.items():
        got = tensors[key]
        if got.shape != value.shape:
            raise CorruptModelError(
                f"draft head {path}: {key} has shape {tuple(got.shape)}, the config says "
                f"{tuple(value.shape)}"
            )
        value.copy_(got.to(value.dtype))


def load_eagle3(
    info: HeadInfo, target: ArchConfig, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> Eagle3Head:
    """An EAGLE-3 head for ``target``, in ``dtype`` on ``device``.

    Raises:
        HeadMismatchError: trained for another target shape or vocabulary.
        CorruptModelError: tensors missing or of the wrong shape.
    """
    tensors = _tensors(info)
    cfg = eagle3_config(info, target, own_embedding="embed_tokens.weight" in tensors)
    check_eagle3_fits(cfg, target, str(info.path))
    if cfg.draft_vocab_size == cfg.target_vocab_size and "d2t" not in tensors:
        # speculators stores no vocabulary map when the draft vocabulary is the target's
        tensors["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        tensors["t2d"] = torch.ones(cfg.target_vocab_size, dtype=torch.bool)
    head = Eagle3Head(cfg)
    _load_state(head, tensors, info.path)
    head.requires_grad_(False)
    return head.to(device=device, dtype=dtype).eval()


def load_medusa(
    info: HeadInfo, target: ArchConfig, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> MedusaHeads:
    """Medusa heads for ``target`` (see :func:`load_eagle3`)."""
    cfg = medusa_config(info)
    check_medusa_fits(cfg, target, str(info.path))
    heads = MedusaHeads(cfg)
    _load_state(heads, _tensors(info), info.path)
    heads.requires_grad_(False)
    return heads.to(device=device, dtype=dtype).eval()
