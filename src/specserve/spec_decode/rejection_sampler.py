"""The verifier: one batched rejection sampler for every proposer.

Terms (vLLM's vocabulary):
    draft_token_ids: per request, the k_i tokens the proposer guessed.
    target_logits: the target's scores for the k_i + 1 positions of each request: row j of
        request i scores the token that follows its committed tokens and drafts ``< j``.
        Requests are laid out back to back: request i owns rows ``cu_num_rows[i] ..
        cu_num_rows[i] + k_i`` where ``cu_num_rows[i] = sum_{j<i} (k_j + 1)``.
    recovered token: what the target samples at the first rejected position.
    bonus token: what the target samples after the last draft when every draft is accepted.

Greedy requests (temperature 0): accept while draft == target argmax, then emit the argmax.
Sampled requests (Leviathan et al., 2023, "Fast Inference from Transformers via Speculative
Decoding", Algorithm 1; Chen et al., 2023): accept draft token x with probability
min(1, p_target(x) / p_draft(x)) -- a one-hot (deterministic) draft has p_draft(x) = 1 --
and at the first rejection sample from norm(max(0, p_target - p_draft)). The output is then
distributed exactly as the target's. Target and draft distributions are processed alike
(``sampling.sampler.logits_to_probs``: temperature, top-k, top-p).

Randomness per request, in order: k_i uniforms (one draw), then one multinomial draw for the
recovered/bonus token. A request with a seeded generator therefore samples the same tokens
whatever else shares the batch; ``reference.py`` consumes randomness in the same order.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from specserve.sampling.sampler import logits_to_probs
from specserve.sampling_params import SamplingParams


def cu_num_rows(draft_lengths: list[int]) -> list[int]:
    """First target-logits row of each request: ``[0, k_0 + 1, k_0 + k_1 + 2, ...]``."""
    starts, total = [], 0
    for n in draft_lengths:
        starts.append(total)
        total += n + 1
    return starts


def _target_probs(
    target_logits: torch.Tensor, rows: list[list[int]], params: list[SamplingParams]
) -> dict[int, torch.Tensor]:
    """Processed target probabilities ``# [k_i + 1, vocab]`` for each sampled request,
    applying logits_to_probs once per distinct (temperature, top_k, top_p)."""
    groups: dict[tuple[float, int, float], list[int]] = defaultdict(list)
    for i in range(len(rows)):
        groups[(params[i].temperature, params[i].top_k, params[i].top_p)].append(i)
    out: dict[int, torch.Tensor] = {}
    for members in groups.values():
        idx = [r for i in members for r in rows[i]]
        probs = logits_to_probs(target_logits[idx], params[members[0]])  # [sum(k_i + 1), V]
        offset = 0
        for i in members:
            n = len(rows[i])
            out[i] = probs[offset : offset + n]
            offset += n
    return out


def rejection_sample(
    draft_token_ids: list[list[int]],
    draft_probs: list[torch.Tensor | None],
    target_logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[list[int]]:
    """Verify a ragged batch of drafts.

    Args:
        draft_token_ids: per request, its k_i draft tokens (k_i may be 0).
        draft_probs: per request, ``# [k_i, vocab]`` processed draft probabilities, or None
            for a deterministic (one-hot) draft.
        target_logits: ``# [sum_i (k_i + 1), vocab]`` raw target logits (see module doc).
        params: per request sampling parameters.
        generators: per request generator (None: the global one).
    Returns:
        per request: the accepted draft tokens followed by one recovered or bonus token
        (1 .. k_i + 1 tokens).
    """
    num_reqs = len(draft_token_ids)
    assert len(draft_probs) == len(params) == len(generators) == num_reqs
    lengths = [len(d) for d in draft_token_ids]
    starts = cu_num_rows(lengths)
    assert target_logits.dim() == 2 and target_logits.shape[0] == sum(lengths) + num_reqs, (
        f"target_logits has {target_logits.shape[0]} rows, drafts need {sum(lengths) + num_reqs}"
    )
    vocab = target_logits.shape[-1]
    rows = [list(range(s, s + n + 1)) for s, n in zip(starts, lengths, strict=True)]
    outputs: list[list[int]] = [[] for _ in range(num_reqs)]

    greedy = [i for i in range(num_reqs) if params[i].greedy]
    if greedy:
        # One host sync for every greedy request's argmax.
        argmax = target_logits[[r for i in greedy for r in rows[i]]].argmax(-1).tolist()
        offset = 0
        for i in greedy:
            target_ids = argmax[offset : offset + lengths[i] + 1]
            offset += lengths[i] + 1
            n = 0
            while n < lengths[i] and draft_token_ids[i][n] == target_ids[n]:
                n += 1
            outputs[i] = [*draft_token_ids[i][:n], target_ids[n]]

    sampled = [i for i in range(num_reqs) if not params[i].greedy]
    if sampled:
        probs = _target_probs(
            target_logits, [rows[i] for i in sampled], [params[i] for i in sampled]
        )
        for j, i in enumerate(sampled):
            outputs[i] = _verify_sampled(
                draft_token_ids[i], draft_probs[i], probs[j], generators[i], vocab
            )
    return outputs


def _verify_sampled(
    draft: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
    vocab: int,
) -> list[int]:
    """One sampled request. ``target_probs # [k + 1, vocab]``, ``draft_probs # [k, vocab]``."""
    k = len(draft)
    assert all(0 <= t < vocab for t in draft), f"draft token outside the vocabulary: {draft}"
    if draft_probs is not None:
        assert draft_probs.shape == (k, vocab), (draft_probs.shape, (k, vocab))
    device = target_probs.device
    draft_t = torch.tensor(draft, dtype=torch.long, device=device)  # [k]
    pos = torch.arange(k, device=device)
    p_target = target_probs[pos, draft_t]  # [k]
    p_draft = (
        draft_probs.to(target_probs)[pos, draft_t]
        if draft_probs is not None
        else torch.ones(k, device=device)
    )  # [k]
    uniforms = torch.rand(k, generator=generator, device=device)  # [k]
    accept = uniforms * p_draft < p_target  # u < p_target / p_draft, without dividing by 0
    # Host sync: the number of leading accepted drafts.
    rejected = (~accept).nonzero()
    n = int(rejected[0, 0]) if rejected.numel() else k
    if n == k:
        final = target_probs[k]  # bonus token from the last row
    else:
        if draft_probs is not None:
            residual = (target_probs[n] - draft_probs[n].to(target_probs)).clamp_min(0.0)
        else:
            residual = target_probs[n].clone()
            residual[draft[n]] = 0.0
        total = residual.sum()
        # A zero residual needs p_target == p_draft, where rejection has probability 0;
        # rounding can still get here, and then the target row is the right fallback.
        final = residual / total if float(total) > 0.0 else target_probs[n]
    token = int(torch.multinomial(final, 1, generator=generator)[0])
    return [*draft[:n], token]
