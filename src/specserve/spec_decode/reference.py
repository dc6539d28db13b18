"""A slow, obviously-correct speculative verifier for one request: the test oracle.

Leviathan et al., 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1, written as plainly as possible: one draft position at a time, Python floats.
Notation as in the paper: ``p`` is the target model's distribution, ``q`` the draft's.

Randomness is consumed in the same order as the batched ``rejection_sampler``: all k
uniforms in one draw, then one multinomial draw, so seeded runs can be compared exactly.
"""

from __future__ import annotations

import math

import torch

from specserve.sampling.sampler import logits_to_probs
from specserve.sampling_params import SamplingParams


def reference_verify(
    draft_token_ids: list[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """Verify one draft.

    Args:
        draft_token_ids: the k draft tokens.
        draft_probs: ``# [k, vocab]`` draft distribution q, or None for a one-hot draft.
        target_logits: ``# [k + 1, vocab]`` raw target logits.
    Returns:
        accepted drafts + one recovered/bonus token.
    """
    k = len(draft_token_ids)
    assert target_logits.shape[0] == k + 1
    if params.greedy:
        out: list[int] = []
        for i in range(k + 1):
            best = int(target_logits[i].argmax())
            if i == k or draft_token_ids[i] != best:
                return [*out, best]
            out.append(best)
    p = logits_to_probs(target_logits, params)  # [k + 1, vocab]
    uniforms = torch.rand(k, generator=generator, device=p.device).tolist()
    out = []
    for i, x in enumerate(draft_token_ids):
        q_row = draft_probs[i].to(p) if draft_probs is not None else _one_hot(x, p[i])
        p_x = float(p[i, x])
        q_x = float(q_row[x])
        ratio = p_x / q_x if q_x > 0 else (math.inf if p_x > 0 else 0.0)
        if uniforms[i] < min(1.0, ratio):
            out.append(x)
            continue
        # Rejected: sample from norm(max(0, p - q)).
        residual = torch.clamp(p[i] - q_row, min=0.0)
        if float(residual.sum()) <= 0.0:
            residual = p[i]
        residual = residual / residual.sum()
        token = int(torch.multinomial(residual, 1, generator=generator)[0])
        return [*out, token]
    bonus = int(torch.multinomial(p[k], 1, generator=generator)[0])
    return [*out, bonus]


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q
