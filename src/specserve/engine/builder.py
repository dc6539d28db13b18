"""Build an :class:`LLMEngine` from an :class:`EngineConfig`: load the target (and the draft),
size the KV cache, and pick the proposer and k controller the :class:`SpecConfig` asks for."""

from __future__ import annotations

import logging
import time

import torch

from specserve.config import EngineConfig, SchedulerConfig, SpecConfig
from specserve.dtypes import torch_dtype
from specserve.engine.llm_engine import LLMEngine
from specserve.loading.gguf_stored import draft_format
from specserve.loading.quant_cache import load_in_format
from specserve.loading.spec_heads import (
    HeadMismatchError,
    load_eagle3,
    load_medusa,
    read_head_info,
    resolve_head,
)
from specserve.models.decoder import DecoderLM
from specserve.models.layer_drop import keep_first_layers
from specserve.models.medusa import MedusaHeads
from specserve.models.native import fused_layer, head_screen
from specserve.spec_decode import warm_start
from specserve.spec_decode.draft_model import check_vocab_compatible
from specserve.spec_decode.factory import make_proposer
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.proposer import Proposer

logger = logging.getLogger(__name__)


def load_head(method: str, spec: str, target: DecoderLM, device: str) -> torch.nn.Module:
    """The trained head ``spec`` (a directory or a trained head's name) for ``method``, in the
    target's compute dtype, checked against the target.

    Raises:
        ModelNotFoundError: no such head, or a file of it is missing.
        CorruptModelError: unreadable config or tensors.
        HeadMismatchError: trained for another target; or a head of the other method.
    """
    info = read_head_info(resolve_head(spec))
    if info.method != method:
        raise HeadMismatchError(
            f"draft head {info.path} is a {info.method} head; --spec-method is {method}"
        )
    if method == "eagle":
        return load_eagle3(info, target.cfg, target.dtype, device)
    return load_medusa(info, target.cfg, target.dtype, device)


def build_spec(
    spec: SpecConfig,
    target: DecoderLM,
    draft: DecoderLM | None = None,
    *,
    scheduler: SchedulerConfig | None = None,
    max_model_len: int = 4096,
    block_size: int = 16,
    head: torch.nn.Module | None = None,
    head_name: str = "",
) -> tuple[Proposer | None, KController | None]:
    """The proposer and k controller for ``spec`` (both None when speculation is off).

    Raises:
        ValueError: a draft-model method without a draft model, a head method without its
            head.
    """
    if not spec.enabled:
        return None, None
    fixed_k = spec.num_speculative_tokens
    k_max = max(spec.k_max, fixed_k or 0)
    if isinstance(head, MedusaHeads):  # one head per draft position: k never exceeds them
        k_max = min(k_max, head.cfg.num_heads)
        fixed_k = None if fixed_k is None else min(fixed_k, k_max)
    controller = KController(k_max, fixed_k=fixed_k, confidence_stop=spec.draft_stops_itself)
    proposer = make_proposer(
        spec.method,
        target.cfg.vocab_size,
        draft,
        max_model_len=max_model_len + k_max + 1,
        ngram_min=spec.ngram_min,
        ngram_max=spec.ngram_max,
        max_num_seqs=(scheduler or SchedulerConfig()).max_num_seqs,
        block_size=block_size,
        target=target,
        head=head,
        head_name=head_name,
        confidence_threshold=spec.draft_confidence_threshold,
    )
    controller.link_proposer(proposer)
    return proposer, controller


def build_engine_from_models(
    config: EngineConfig,
    target: DecoderLM,
    tokenizer: object = None,
    draft: DecoderLM | None = None,
    model_name: str | None = None,
    head: torch.nn.Module | None = None,
    head_name: str = "",
) -> LLMEngine:
    """An engine over already-built models (tests, benchmarks); ``head``: a loaded EAGLE-3
    or Medusa head for those methods."""
    limit = min(config.model.max_model_len or 1 << 62, target.cfg.max_position_embeddings)
    proposer, controller = build_spec(
        config.spec,
        target,
        draft,
        scheduler=config.scheduler,
        max_model_len=limit,
        block_size=config.cache.block_size,
        head=head,
        head_name=head_name,
    )
    torch.manual_seed(config.seed)
    eos = getattr(tokenizer, "eos_token_ids", None)
    return LLMEngine(
        target,
        tokenizer=tokenizer,  # type: ignore[arg-type]
        eos_token_ids=tuple(eos) if eos is not None else None,
        cache=config.cache,
        scheduler=config.scheduler,
        spec=config.spec,
        proposer=proposer,
        k_controller=controller,
        model_name=model_name or config.model.model,
        max_model_len=config.model.max_model_len,
    )


def build_engine(config: EngineConfig) -> LLMEngine:
    """Load the models named in ``config`` (``specserve.loading.load_model``) and build."""
    dtype, device = torch_dtype(config.model.dtype), config.model.device
    target = load_in_format(config.model.model, config.model.weights, dtype, device)
    draft = None
    draft_weights = None
    if config.spec.uses_draft_model and config.spec.enabled:
        assert config.spec.draft_model is not None
        draft_weights = draft_format(
            config.spec.draft_weights,
            config.model.weights,
            config.spec.draft_model,
            device,
            config.model.dtype,
        )
        draft_lm = load_in_format(config.spec.draft_model, draft_weights, dtype, device)
        check_vocab_compatible(
            target.arch.vocab_size,
            draft_lm.arch.vocab_size,
            target.tokenizer,
            draft_lm.tokenizer,
        )
        draft = draft_lm.model
        if config.spec.draft_num_layers is not None:
            draft = keep_first_layers(draft, config.spec.draft_num_layers)
        if draft is not target.model:
            # proposals need neither batch invariance nor exact sums: wherever the CPU has
            # the AMX tiles, switch or not, the draft's prompt chunks and catch-ups take them
            # (its one-token steps stay on the faster vdpbf16ps kernels), and on AVX2 its
            # one-token int4 matmuls round x to int8
            fused_layer.set_draft(draft)
    head, head_name = None, ""
    if config.spec.uses_head and config.spec.enabled:
        assert config.spec.draft_model is not None
        head = load_head(config.spec.method, config.spec.draft_model, target.model, device)
        head_name = config.spec.draft_model
    engine = build_engine_from_models(
        config, target.model, target.tokenizer, draft, target.name, head, head_name
    )
    if head is not None:
        engine.model_info.update({"draft_head": head_name, "draft_method": config.spec.method})
        logger.info("loaded %s head %s", config.spec.method, head_name)
    formats = {"target": config.model.weights, "draft": draft_weights}
    for role, model in (("target", target.model), ("draft", draft)):
        if model is None:
            continue
        info = {
            "weights": formats[role] or config.model.dtype,
            "dtype": str(model.dtype).removeprefix("torch."),
            "device": str(model.device),
            "decode_path": fused_layer.describe(model),
        }
        engine.model_info.update({f"{role}_{key}": value for key, value in info.items()})
        name = config.model.model if role == "target" else config.spec.draft_model
        logger.info(
            "loaded %s %s on %s: weights %s, compute %s, decode/verify path: %s",
            role, name, config.model.device, info["weights"], info["dtype"], info["decode_path"],
        )  # fmt: skip
    if engine.k_controller is not None and warm_start.enabled():
        t0 = time.perf_counter()
        seconds = warm_start.warm(engine.k_controller, target.model)
        if seconds:
            logger.info(
                "k controller: target steps of 1-%d tokens timed at start in %.1f s (%s ms)",
                len(seconds), time.perf_counter() - t0, " ".join(f"{1e3 * s:.0f}" for s in seconds),
            )  # fmt: skip
    if draft is not None and config.spec.enabled:
        threshold = config.spec.draft_confidence_threshold
        engine.model_info["draft_confidence_threshold"] = str(threshold)
        engine.model_info["draft_greedy_head"] = head_screen.describe(draft.lm_head)
        logger.info(
            "draft confidence stop: %s; greedy draft LM head: %s",
            f"after a token drafted below p = {threshold:g}" if threshold > 0 else "off",
            engine.model_info["draft_greedy_head"],
        )
    return engine
