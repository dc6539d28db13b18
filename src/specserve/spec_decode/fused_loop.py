"""Fused greedy speculation with a draft model: k draft forwards and the target's verification with
no host round-trip in between, one host sync per step.

The unfused loop (``spec_decode/speculative_loop.py`` + ``DraftModelProposer``) turns each draft
token into a Python int before feeding it back, builds the proposal lists, and syncs again after
the verification. Here the draft's argmax stays a device tensor and is fed straight back; the k
drafts and the target's k + 1 argmaxes come to the host together, once per step. On CPU the
saving is the per-token bookkeeping; on CUDA it is also the k launch-and-wait round trips.

Greedy only (temperature 0): acceptance is "draft token == target argmax", so the output equals
plain greedy decoding of the target whenever verify and decode compute the same numbers (fp32,
or weight-only int8/int4 — see models/quant/layers.py). Sampled requests use the unfused loop.

Caches: target and draft each own a :class:`SingleSequenceCache`. The target cache holds every
committed token but the last; the draft cache every committed token but the *pending* ones (the
last committed token, plus the last draft after a fully accepted step, whose K/V the draft never
computed; at the start, the whole prompt)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.sampling.stop import check_new_tokens
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import GenerationResult, generation_budget


@dataclass
class FusedResult(GenerationResult):
    """A :class:`GenerationResult` plus acceptance counts.

    Attributes:
        num_draft_tokens: drafts proposed in total.
        num_accepted_tokens: drafts accepted in total.
    """

    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    k_history: list[int] = field(default_factory=list)


def draft_tokens(
    draft: DecoderLM, cache: SingleSequenceCache, pending: torch.Tensor, k: int
) -> torch.Tensor:
    """Feed ``pending # [P]`` to the draft, then draft ``k`` tokens greedily; returns
    ``# [k]`` on the device (no host sync: each argmax is fed back as a tensor)."""
    out = []
    feed = pending
    for _ in range(k):
        hidden = cache.forward(feed)  # [T, hidden]
        feed = draft.compute_logits(hidden[-1:]).argmax(-1)  # [1]
        out.append(feed)
    return torch.cat(out)


@torch.inference_mode()
def generate_fused_greedy(
    target: DecoderLM,
    draft: DecoderLM,
    prompt_ids: list[int],
    params: SamplingParams,
    eos_token_ids: tuple[int, ...],
    k: int,
    max_model_len: int | None = None,
) -> FusedResult:
    """Greedy speculative generation with a fixed k (see the module docstring)."""
    if not params.greedy:
        raise ValueError("fused speculation is greedy only; use generate_speculative to sample")
    if params.stop:
        raise ValueError("fused speculation does not check stop strings")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not prompt_ids:
        raise ValueError("prompt must contain at least one token")
    budget = generation_budget(target, len(prompt_ids), params, max_model_len)
    length = len(prompt_ids) + budget + k + 1
    t_cache, d_cache = SingleSequenceCache(target, length), SingleSequenceCache(draft, length)
    device = target.device
    result = FusedResult([], "length", len(prompt_ids), 0.0, 0.0)
    out = result.token_ids

    t0 = time.perf_counter()
    logits = target.compute_logits(t_cache.forward(prompt_ids)[-1:])  # [1, vocab]
    new_tokens = [int(logits.argmax())]
    # The draft has seen nothing yet: the whole prompt and the first token are pending
    # (its prefill happens in the first draft call, as in the unfused proposer).
    pending = [*prompt_ids, new_tokens[0]]
    t1 = time.perf_counter()
    while True:
        decision = check_new_tokens(new_tokens, len(out), params, eos_token_ids, budget)
        out.extend(new_tokens[: decision.num_kept])
        if decision.finish_reason is not None:
            result.finish_reason = decision.finish_reason
            break
        num_k = min(k, budget - len(out) - 1)
        last = torch.tensor([pending[-1]], device=device)
        if num_k > 0:
            drafts = draft_tokens(draft, d_cache, torch.tensor(pending, device=device), num_k)
            ids = torch.cat([last, drafts])  # [1 + num_k]
        else:
            ids = last
        logits = target.compute_logits(t_cache.forward(ids))  # [1 + num_k, vocab]
        # The step's only host sync: drafts and the target's argmaxes together.
        both = torch.cat([ids[1:], logits.argmax(-1)]).tolist()
        draft_list, target_list = both[:num_k], both[num_k:]
        accepted = 0
        while accepted < num_k and draft_list[accepted] == target_list[accepted]:
            accepted += 1
        new_tokens = [*draft_list[:accepted], target_list[accepted]]
        result.k_history.append(num_k)
        result.num_target_forwards += 1
        result.num_draft_tokens += num_k
        result.num_accepted_tokens += accepted
        # Roll back both caches to the committed tokens (bookkeeping only).
        committed = len(prompt_ids) + len(out) + accepted  # positions with correct K/V
        t_cache.truncate(committed)
        if num_k == 0:  # the draft did not run: what was pending still is
            pending = [*pending, target_list[0]]
        elif accepted == num_k:
            # The draft never ran its last draft token: it becomes pending with the bonus.
            d_cache.truncate(committed - 1)
            pending = [draft_list[-1], target_list[accepted]]
        else:
            d_cache.truncate(committed)
            pending = [target_list[accepted]]
    result.prefill_s, result.decode_s = t1 - t0, time.perf_counter() - t1
    return result
