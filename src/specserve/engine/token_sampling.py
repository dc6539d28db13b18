"""From target logits to new tokens: min_tokens masking, then plain sampling (no drafts in the
step: the k = 0 fast path) or rejection sampling of every request's draft."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.engine.request import Request
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
