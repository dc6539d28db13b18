"""Plain (non-speculative) batch-1 generation: the baseline every speedup is measured against."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.sampling.sampler import make_generator, next_token
from specserve.sampling.stop import check_new_tokens
from specserve.sampling_params import SamplingParams


@dataclass
class GenerationResult:
    """Output of one batch-1 generation.

    Attributes:
        token_ids: generated tokens (a final EOS/stop id included, like vLLM counts it).
        finish_reason: ``stop`` or ``length``.
        num_prompt_tokens: prompt length.
        prefill_s: wall time of the prompt forward (and first token).
        decode_s: wall time of everything after the first token.
        num_target_forwards: target forward passes after prefill (== tokens - 1 when plain).
    """

    token_ids: list[int]
    finish_reason: str
    num_prompt_tokens: int
    prefill_s: float
    decode_s: float
    num_target_forwards: int = 0

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.token_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.num_prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0


def generation_budget(
    model: DecoderLM,
    num_prompt_tokens: int,
    params: SamplingParams,
    max_model_len: int | None = None,
) -> int:
    """Tokens that may be generated: max_tokens capped by the context room left."""
    limit = max_model_len or model.cfg.max_position_embeddings
    room = limit - num_prompt_tokens
    if room < 1:
        raise ValueError(
            f"prompt of {num_prompt_tokens} tokens leaves no room in the {limit}-token context"
        )
    return min(params.max_tokens, room)


@torch.inference_mode()
def generate_plain(
    model: DecoderLM,
    prompt_ids: list[int],
    params: SamplingParams,
    eos_token_ids: tuple[int, ...],
    max_model_len: int | None = None,
) -> GenerationResult:
    """Prefill, then one target forward per token until a stop condition."""
    if not prompt_ids:
        raise ValueError("prompt must contain at least one token")
    budget = generation_budget(model, len(prompt_ids), params, max_model_len)
    cache = SingleSequenceCache(model, len(prompt_ids) + budget)
    gen = make_generator(params, model.device)
    out: list[int] = []
    t0 = time.perf_counter()
    hidden = cache.forward(prompt_ids)
    tok = next_token(model.compute_logits(hidden[-1]), params, gen)
    t1 = time.perf_counter()
    forwards = 0
    while True:
        decision = check_new_tokens([tok], len(out), params, eos_token_ids, budget)
        out.append(tok)
        if decision.finish_reason is not None:
            break
        hidden = cache.forward([tok])
        forwards += 1
        tok = next_token(model.compute_logits(hidden[-1]), params, gen)
    t2 = time.perf_counter()
    return GenerationResult(
        out, decision.finish_reason, len(prompt_ids), t1 - t0, t2 - t1, forwards
    )
