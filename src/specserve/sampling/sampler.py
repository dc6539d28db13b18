"""Logit processing and sampling shared by plain decoding, draft models and the verifier.

The same :func:`logits_to_probs` runs on target and draft logits so that the rejection
sampler compares like with like (docs/design.md, "Verifier").
"""

from __future__ import annotations

import torch

from specserve.sampling_params import SamplingParams


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to ``logits # [N, V]``; returns ``probs # [N, V]``.

    Greedy requests get a one-hot distribution on the argmax, so callers may treat every
    request alike; the greedy fast paths avoid calling this at all.
    """
    logits = logits.float()
    if params.greedy:
        probs = torch.zeros_like(logits)
        probs.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return probs
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, sorted_idx = probs.sort(dim=-1, descending=True)
        cum = sorted_probs.cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
        drop_sorted = (cum - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """A per-request generator when the request has a seed, so its samples do not depend
    on which other requests share the batch."""
    if params.seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of ``probs # [N, V]``; returns ``# [N]``."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """Choose the next token from one row of logits ``# [V]`` (host sync: returns an int)."""
    if params.greedy:
        return int(logits.argmax())
    return int(sample(logits_to_probs(logits.view(1, -1), params), generator)[0])


def sample_rows(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """One token per row of ``logits # [N, V]``, row i under ``params[i]``; returns ``# [N]``
    on the logits' device (no host sync: the caller reads every request's token at once)."""
    assert logits.shape[0] == len(params) == len(generators)
    tokens = logits.argmax(-1)  # greedy rows are done; sampled rows are overwritten below
    for i, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            tokens[i] = sample(logits_to_probs(logits[i : i + 1], p), gen)[0]
    return tokens


def suppress_tokens(logits: torch.Tensor, token_ids: list[int]) -> None:
    """Set ``logits # [N, V]`` of ``token_ids`` to -inf in place (e.g. EOS before min_tokens)."""
    if token_ids:
        logits[:, token_ids] = float("-inf")
