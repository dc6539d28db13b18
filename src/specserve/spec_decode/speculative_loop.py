"""Batch-1 speculative generation: the whole algorithm in one readable loop.

Each step: the proposer drafts k tokens after the committed ones; the target runs the last
committed token and the k drafts in one forward (k + 1 logit rows); the rejection sampler
keeps the accepted prefix plus one recovered/bonus token; the target cache is rolled back
over the rejected drafts by moving its pointer. With k = 0 a step is exactly a plain decode
step, with nothing else run. Stop conditions (EOS/stop ids, stop strings, max_tokens, the
context limit) are checked on the accepted tokens in order, so a stop inside an accepted
draft ends generation at the same token plain decoding would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.sampling.sampler import make_generator, next_token
from specserve.sampling.stop import check_new_tokens, find_stop_string
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.plain_loop import GenerationResult, generation_budget
from specserve.spec_decode.proposer import (
    HiddenStateProposer,
    ProposeInput,
    Proposer,
    draft_cost_sample,
    report_verify_time,
)
from specserve.spec_decode.rejection_sampler import rejection_sample
from specserve.spec_decode.stats import SpecDecodingStats


@dataclass
class SpecGenerationResult(GenerationResult):
    """A :class:`GenerationResult` plus what speculation did.

    Attributes:
        stats: acceptance counters (vLLM definitions).
        draft_s: total wall time spent proposing.
        verify_s: total wall time of target forwards + verification after prefill.
        k_history: the k chosen at each step (0 = plain step).
        text: decoded output, cut before a stop string (only when a detokenizer was given).
    """

    stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    draft_s: float = 0.0
    verify_s: float = 0.0
    k_history: list[int] = field(default_factory=list)
    text: str | None = None


def truncate_at_stop_string(
    token_ids: list[int],
    num_checked: int,
    stop: tuple[str, ...],
    detokenize: Callable[[list[int]], str],
) -> tuple[int, str] | None:
    """If a stop string appears in the text of ``token_ids``, return how many tokens a
    token-by-token decoder would have produced (up to the one completing the stop string)
    and the text before the stop string; None otherwise. Tokens before ``num_checked``
    were already checked (without a hit)."""
    text = detokenize(token_ids)
    prev_text = detokenize(token_ids[:num_checked]) if num_checked else ""
    if find_stop_string(text, stop, len(prev_text)) is None:
        return None
    for n in range(max(num_checked, 1), len(token_ids) + 1):
        idx = find_stop_string(detokenize(token_ids[:n]), stop)
        if idx is not None:
            return n, text[:idx]
    raise AssertionError("stop string found in the full text but in no prefix")


@torch.inference_mode()
def generate_speculative(
    target: DecoderLM,
    proposer: Proposer,
    prompt_ids: list[int],
    params: SamplingParams,
    eos_token_ids: tuple[int, ...],
    k: int | KController,
    max_model_len: int | None = None,
    detokenize: Callable[[list[int]], str] | None = None,
    request_id: str = "0",
) -> SpecGenerationResult:
    """Generate with speculative decoding; the output equals ``generate_plain``'s (greedy,
    fp32) or follows the same distribution (sampled).

    Args:
        target: the model whose output distribution is produced.
        proposer: drafts tokens (its state for ``request_id`` is released at the end).
        prompt_ids: prompt tokens (non-empty).
        params: sampling parameters; stop strings need ``detokenize``.
        eos_token_ids: the target's end-of-sequence ids.
        k: a fixed number of draft tokens per step, or a controller choosing it per step.
        max_model_len: context limit (default: the target's).
        detokenize: token ids -> text, for stop strings and ``result.text``.
        request_id: the id the proposer and controller key their state by.
    """
    if not prompt_ids:
        raise ValueError("prompt must contain at least one token")
    if params.stop and detokenize is None:
        raise ValueError("stop strings need a detokenize function")
    if isinstance(k, int) and k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    budget = generation_budget(target, len(prompt_ids), params, max_model_len)
    cache = SingleSequenceCache(target, len(prompt_ids) + budget)
    gen = make_generator(params, target.device)
    result = SpecGenerationResult([], "length", len(prompt_ids), 0.0, 0.0)
    out = result.token_ids

    # A proposer drafting from the target's hidden states gets the rows of every committed
    # position from the forwards below (prefill, then each verify), never from an extra one.
    wants_hidden = isinstance(proposer, HiddenStateProposer) and k != 0
    saved_capture = target.capture_layers
    if isinstance(proposer, HiddenStateProposer) and wants_hidden:
        target.capture_layers = tuple(proposer.target_hidden_layers)
    if isinstance(k, KController):
        k.link_proposer(proposer)  # a hybrid's suffix drafts cost no draft forward
    t0 = time.perf_counter()
    hidden = cache.forward(prompt_ids)  # [P, hidden]
    pending = (0, cache.last_captured)  # (first position, rows) not yet shown to the proposer
    new_tokens = [next_token(target.compute_logits(hidden[-1]), params, gen)]
    prefill = getattr(proposer, "prefill", None)  # optional: a draft model's own prefill
    if prefill is not None and k != 0:
        prefill(request_id, prompt_ids)  # counted in prefill time, like TTFT in a server
    t1 = time.perf_counter()
    try:
        while True:
            # Commit the new tokens up to the first stop condition.
            decision = check_new_tokens(new_tokens, len(out), params, eos_token_ids, budget)
            num_checked = len(out)
            out.extend(new_tokens[: decision.num_kept])
            finish = decision.finish_reason
            if params.stop and detokenize is not None:
                hit = truncate_at_stop_string(out, num_checked, params.stop, detokenize)
                if hit is not None:
                    del out[hit[0] :]
                    result.text, finish = hit[1], "stop"
            if finish is not None:
                result.finish_reason = finish
                break
            num_k = k.choose_k(request_id, 1) if isinstance(k, KController) else k
            # k drafts + 1 bonus token must fit the remaining budget.
            num_k = min(num_k, budget - len(out) - 1)
            step = speculative_step(
                target, proposer, cache, [*prompt_ids, *out], params, gen, num_k, request_id,
                hidden=pending if num_k > 0 else None,
            )  # fmt: skip
            new_tokens = step.new_tokens
            if wants_hidden:
                pending = _pending_hidden(pending, num_k > 0, cache.last_captured, new_tokens)
            result.k_history.append(num_k)
            result.num_target_forwards += 1
            result.draft_s += step.draft_s
            result.verify_s += step.verify_s
            result.stats.observe(step.num_draft_tokens, len(new_tokens) - 1)
            report_verify_time(proposer, step.verify_s)
            if isinstance(k, KController):
                k.observe(request_id, step.num_draft_tokens, len(new_tokens) - 1, num_asked=num_k)
                # A propose call that caught up the tokens of earlier k = 0 steps teaches
                # nothing about drafting's cost (as in the engine).
                draft_s, draft_steps = draft_cost_sample(proposer, step.draft_s, num_k)
                k.record_cost(
                    draft_s,
                    draft_steps,
                    step.verify_s,
                    step.num_draft_tokens + 1,
                    step_s=step.draft_s + step.verify_s,
                )
    finally:
        target.capture_layers = saved_capture
        proposer.release(request_id)
        if isinstance(k, KController):
            k.release(request_id)
    result.prefill_s, result.decode_s = t1 - t0, time.perf_counter() - t1
    if detokenize is not None and result.text is None:
        result.text = detokenize(out)
    return result


def _pending_hidden(
    pending: tuple[int, torch.Tensor | None],
    shown: bool,
    captured: torch.Tensor | None,
    new_tokens: list[int],
) -> tuple[int, torch.Tensor | None]:
    """The hidden-state rows still to show the proposer after a step: the step's verify
    forward made positions final for the last committed token and the accepted drafts
    (``len(new_tokens)`` rows); rows already shown (``shown``) are dropped."""
    start, rows = pending
    assert captured is not None
    kept = captured[: len(new_tokens)]
    if shown or rows is None:
        return (start + (len(rows) if rows is not None else 0), kept)
    return (start, torch.cat((rows, kept)))


@dataclass(frozen=True)
class StepOutcome:
    """What one speculative step produced.

    Attributes:
        new_tokens: accepted drafts + the recovered/bonus token (1 .. k + 1 tokens).
        num_draft_tokens: drafts the proposer returned (<= k; 0 => a plain step).
        draft_s: wall time of the propose call.
        verify_s: wall time of the target forward and the verification.
    """

    new_tokens: list[int]
    num_draft_tokens: int
    draft_s: float
    verify_s: float


def speculative_step(
    target: DecoderLM,
    proposer: Proposer,
    cache: SingleSequenceCache,
    committed: list[int],
    params: SamplingParams,
    gen: torch.Generator | None,
    num_k: int,
    request_id: str,
    hidden: tuple[int, torch.Tensor | None] | None = None,
) -> StepOutcome:
    """Draft ``num_k`` tokens after ``committed``, verify them in one target forward and
    roll the target cache back over the rejected ones.

    The cache holds every committed token but the last (``committed[-1]`` is fed now).
    ``hidden``: for a proposer drafting from the target's hidden states, the first position
    and rows of the committed positions it has not been shown (``ProposeInput``).
    """
    assert cache.num_tokens == len(committed) - 1
    t0 = time.perf_counter()
    draft: list[int] = []
    draft_probs = None
    if num_k > 0:
        start, rows = hidden if hidden is not None else (0, None)
        inp = ProposeInput(
            request_id, committed, num_k, params, gen, hidden_states=rows, hidden_start=start
        )
        proposal = proposer.propose([inp])[0]
        draft, draft_probs = proposal.draft_token_ids, proposal.draft_probs
        assert len(draft) <= num_k, f"proposer returned {len(draft)} > {num_k} tokens"
    t1 = time.perf_counter()
    verified = cache.forward([committed[-1], *draft])  # [1 + len(draft), hidden]
    logits = target.compute_logits(verified)  # [1 + len(draft), vocab]
    if draft:
        new_tokens = rejection_sample([draft], [draft_probs], logits, [params], [gen])[0]
    else:
        new_tokens = [next_token(logits[-1], params, gen)]  # exactly a plain step
    # KV rollback: keep the committed tokens and the accepted drafts, forget the rest.
    cache.truncate(len(committed) + len(new_tokens) - 1)
    return StepOutcome(new_tokens, len(draft), t1 - t0, time.perf_counter() - t1)
