"""vLLM's ``--speculative-config '{json}'`` for ``specserve serve``, mapped onto specserve's
speculation settings (what ``--spec-method``, ``--draft-model``, ``--num-speculative-tokens``
and ``--speculative-disable-by-batch-size`` set), so a vLLM command line carries over.

Keys (vLLM's ``SpeculativeConfig`` field names) and what they become:

- ``method``: ``ngram`` → ``ngram``, ``draft_model`` → ``draft``, ``suffix`` → ``suffix``.
  EAGLE, EAGLE-3, Medusa, the MLP speculator and MTP heads are refused (not implemented yet).
- ``model``: the draft model. Without ``method`` it implies ``draft_model``, as in vLLM
  (``"ngram"`` and ``"[ngram]"`` imply ``ngram``).
- ``num_speculative_tokens``: the fixed k (1..32). Absent: specserve's adaptive k (vLLM would
  require it).
- ``prompt_lookup_min`` / ``prompt_lookup_max``: the n-gram lengths (``ngram`` only). One
  given sets the other, as in vLLM; neither: specserve's 2..4 (vLLM's 5..5).
- ``disable_by_batch_size``: no drafting in steps of at least this many requests.
- ``draft_tensor_parallel_size``, ``max_model_len``: accepted and ignored with a warning (the
  draft runs unsharded beside the target and follows the target's context).

Any other key is refused, naming it and the known ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specserve.config import HEAD_METHODS, SpecMethod

METHODS: dict[str, SpecMethod] = {
    "ngram": "ngram",
    "[ngram]": "ngram",
    "draft_model": "draft",
    "suffix": "suffix",
    "eagle3": "eagle",
    "medusa": "medusa",
}
# vLLM methods specserve does not have (yet): refused with a clear message.
NOT_IMPLEMENTED = (
    "eagle",
    "mlp_speculator",
    "mtp",
    "deepseek_mtp",
    "ernie_mtp",
    "qwen3_next_mtp",
    "mimo_mtp",
    "longcat_flash_mtp",
    "ngram_gpu",
    "dflash",
    "custom_class",
)
IGNORED = {
    "draft_tensor_parallel_size": "the draft runs unsharded beside the target",
    "max_model_len": "the draft follows the target's context length",
}
KNOWN_KEYS = (
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "disable_by_batch_size",
    *IGNORED,
)
MAX_K = 32


@dataclass(frozen=True)
class VllmSpeculation:
    """What a vLLM ``--speculative-config`` asks of specserve.

    Attributes:
        method: specserve's method name.
        draft_model: the draft (method ``draft``) or the head (``eagle``, ``medusa``), else
            None.
        num_speculative_tokens: the fixed k, or None for the adaptive controller.
        ngram_min / ngram_max: the n-gram lengths (method ``ngram``), None for the defaults.
        disable_by_batch_size: the batch size from which nobody drafts, or None.
        warnings: what was accepted but ignored.
    """

    method: SpecMethod
    draft_model: str | None = None
    num_speculative_tokens: int | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None
    disable_by_batch_size: int | None = None
    warnings: tuple[str, ...] = ()


def _int(config: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"--speculative-config: {key} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"--speculative-config: {key} must be {bound}, got {value}")
    return value


def _method(config: dict[str, Any]) -> SpecMethod:
    method, model = config.get("method"), config.get("model")
    if method is None:
        if model is None:
            raise ValueError("--speculative-config needs 'method' (or a draft 'model')")
        return "ngram" if model in ("ngram", "[ngram]") else "draft"
    if not isinstance(method, str):
        raise ValueError(f"--speculative-config: method must be a string, got {method!r}")
    if method in METHODS:
        return METHODS[method]
    if method in NOT_IMPLEMENTED:
        raise ValueError(
            f"--speculative-config: method {method!r} is not implemented in specserve yet; "
            f"available: {', '.join(sorted(set(METHODS) - {'[ngram]'}))}"
        )
    raise ValueError(
        f"--speculative-config: unknown method {method!r}; known: "
        f"{', '.join(sorted(set(METHODS) - {'[ngram]'}))} (not implemented yet: "
        f"{', '.join(NOT_IMPLEMENTED)})"
    )


def parse_speculative_config(text: str) -> VllmSpeculation:
    """Map vLLM's JSON onto specserve's settings.

    Raises:
        ValueError: invalid JSON, an unknown key or method, a value of the wrong type or out
            of range, or a key that does not fit the method; the message names it.
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError('--speculative-config must be a JSON object, e.g. \'{"method": "ngram"}\'')
    for key in config:
        if key not in KNOWN_KEYS:
            raise ValueError(
                f"--speculative-config: unknown key {key!r}; known keys: {', '.join(KNOWN_KEYS)}"
            )
    method = _method(config)
    model = config.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"--speculative-config: model must be a string, got {model!r}")
    if method == "draft":
        if not model:
            raise ValueError("--speculative-config: method draft_model needs 'model' (the draft)")
    elif method in HEAD_METHODS:
        if not model:
            raise ValueError(
                f"--speculative-config: method {config.get('method')!r} needs 'model' (the "
                "head's directory, e.g. one `specserve train-draft` wrote)"
            )
    elif model is not None and not (method == "ngram" and model in ("ngram", "[ngram]")):
        raise ValueError(
            f"--speculative-config: 'model' is the draft of method draft_model; method "
            f"{config.get('method')!r} takes none (got {model!r})"
        )
    lo, hi = _int(config, "prompt_lookup_min", 1), _int(config, "prompt_lookup_max", 1)
    if (lo is not None or hi is not None) and method != "ngram":
        raise ValueError("--speculative-config: prompt_lookup_min/max are for method ngram only")
    if lo is None and hi is not None:
        lo = hi
    elif hi is None and lo is not None:
        hi = lo
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(
            f"--speculative-config: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}"
        )
    warnings = []
    for key, why in IGNORED.items():
        if key in config:
            _int(config, key, 1)
            warnings.append(f"--speculative-config: {key} is ignored ({why})")
    return VllmSpeculation(
        method=method,
        draft_model=model if method == "draft" or method in HEAD_METHODS else None,
        num_speculative_tokens=_int(config, "num_speculative_tokens", 1, MAX_K),
        ngram_min=lo,
        ngram_max=hi,
        disable_by_batch_size=_int(config, "disable_by_batch_size", 1),
        warnings=tuple(warnings),
    )
