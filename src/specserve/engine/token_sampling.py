"""From target logits to new tokens: min_tokens masking, then plain sampling (no drafts in the
step: the k = 0 fast path) or rejection sampling of every request's draft; and, only for the
requests that asked, the logprobs of prompt and new tokens (``sampling/logprobs.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.engine.request import Request
from specserve.sampling.logprobs import gather_logprobs, log_probs
from specserve.sampling.sampler import sample_rows, suppress_tokens
from specserve.spec_decode.proposer import Proposal
from specserve.spec_decode.rejection_sampler import rejection_sample


def mask_min_tokens(req: Request, logits: torch.Tensor, eos_token_ids: Sequence[int]) -> None:
    """Suppress EOS/stop ids on rows whose token would be generated before ``min_tokens``.

    Row j of ``logits # [k + 1, V]`` scores output token number ``num_output_tokens + j``.
    Masking (instead of emitting and then ignoring) keeps the stop token out of the text and
    keeps verification lossless: the target distribution itself excludes it.
    """
    p = req.params
    num_masked = min(p.min_tokens - req.num_output_tokens, logits.shape[0])
    if num_masked <= 0:
        return
    ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
    suppress_tokens(logits[:num_masked], sorted(ids))


def sample_new_tokens(
    logits: torch.Tensor,
    requests: Sequence[Request],
    proposals: Sequence[Proposal],
    eos_token_ids: Sequence[int],
) -> list[list[int]]:
    """New tokens per request: its accepted draft tokens followed by one sampled token.

    Args:
        logits: ``# [sum_i (k_i + 1), vocab]`` fp32 target logits, request i owning
            ``len(proposals[i]) + 1`` consecutive rows (modified in place by the masking).
        requests: the requests that sample this step, in row order.
        proposals: their drafts (empty for k = 0 and for a request finishing its prefill).
        eos_token_ids: the model's EOS ids.
    """
    offset = 0
    for req, prop in zip(requests, proposals, strict=True):
        mask_min_tokens(req, logits[offset : offset + len(prop) + 1], eos_token_ids)
        offset += len(prop) + 1
    assert offset == logits.shape[0]
    params = [r.params for r in requests]
    gens = [r.generator for r in requests]
    if all(len(p) == 0 for p in proposals):
        # k = 0 fast path. The step's one host sync: .tolist().
        return [[t] for t in sample_rows(logits, params, gens).tolist()]
    # A request without a draft just samples its single row here, consuming its randomness
    # exactly as sample_rows would. The rejection sampler reads results back once (host sync).
    return rejection_sample(
        [p.draft_token_ids for p in proposals],
        [p.draft_probs for p in proposals],
        logits,
        params,
        gens,
    )


def num_prompt_logit_rows(req: Request, num_new_tokens: int) -> int:
    """Rows of a prefill chunk that score prompt tokens not yet given a logprob.

    The chunk runs positions ``start .. start + num_new_tokens - 1``; position p scores token
    p + 1, so prompt tokens ``1 .. num_prompt_tokens - 1`` are scored by positions ``0 ..
    num_prompt_tokens - 2`` (the last prompt position scores the first output token and is
    the row the request samples from). 0 unless the request wants prompt logprobs.
    """
    if not req.wants_prompt_logits:
        return 0
    start = req.num_computed_tokens
    return max(0, min(start + num_new_tokens, req.num_prompt_tokens - 1) - start)


def take_prompt_logprobs(
    logits: torch.Tensor,
    requests: Sequence[Request],
    num_prompt_rows: Sequence[int],
    num_sample_rows: Sequence[int],
) -> torch.Tensor:
    """Record prompt logprobs from a forward's logits and return only the sampling rows.

    Args:
        logits: ``# [sum_i (num_prompt_rows[i] + num_sample_rows[i]), vocab]``, request i's
            prompt rows first, then its sampling rows (``ModelRunner.execute`` order).
        requests: the scheduled requests, in row order.
        num_prompt_rows: per request, from :func:`num_prompt_logit_rows`.
        num_sample_rows: per request, ``k_i + 1`` when it samples this step, else 0.
    """
    keep: list[torch.Tensor] = []
    offset = 0
    for req, n_prompt, n_sample in zip(requests, num_prompt_rows, num_sample_rows, strict=True):
        if n_prompt:
            assert req.prompt_logprobs is not None and req.params.prompt_logprobs is not None
            start = req.num_computed_tokens
            # Rows already recorded before a preemption are recomputed, not recorded again.
            skip = len(req.prompt_logprobs) - 1 - start
            assert skip >= 0, "prompt chunks run in order from position 0"
            if skip < n_prompt:
                targets = req.token_ids[start + 1 + skip : start + 1 + n_prompt]
                rows = log_probs(logits[offset + skip : offset + n_prompt])
                req.prompt_logprobs.extend(
                    gather_logprobs(rows, targets, req.params.prompt_logprobs)
                )
        offset += n_prompt
        if n_sample:
            keep.append(logits[offset : offset + n_sample])
        offset += n_sample
    assert offset == logits.shape[0]
    return torch.cat(keep) if keep else logits[:0]


def raw_logprob_rows(
    logits: torch.Tensor, requests: Sequence[Request], proposals: Sequence[Proposal]
) -> dict[int, torch.Tensor]:
    """Log-softmax of the verify rows of each request that asked for logprobs, keyed by its
    index in ``requests``; taken before :func:`sample_new_tokens` masks ``logits`` in place."""
    out: dict[int, torch.Tensor] = {}
    offset = 0
    for i, (req, prop) in enumerate(zip(requests, proposals, strict=True)):
        n = len(prop) + 1
        if req.params.logprobs is not None:
            out[i] = log_probs(logits[offset : offset + n])
        offset += n
    return out
