"""Log-probabilities of chosen tokens and their most likely alternatives.

Which distribution: the model's raw one, ``log_softmax`` of the fp32 logits as the forward
computed them, before temperature, top-k/top-p and min_tokens masking (vLLM's default
``raw_logprobs``). The same function runs on a plain decode step's one row and on each row
of a speculative verify forward, where row j scores the token after the committed tokens and
the drafts before j; so an accepted draft token, the recovered token and the bonus token get
exactly the value plain decoding gives the same token at the same position.

Nothing here runs unless a request asked for logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability and the most likely tokens at its position.

    Attributes:
        token_id: the token that was emitted (or, for a prompt, the token that was there).
        logprob: its log-probability under the model's raw distribution.
        top: the ``n`` most likely ``(token_id, logprob)`` at that position, most likely
            first (n as the request asked; empty for n = 0).
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` of ``logits # [N, V]`` in fp32 (a new tensor, so later in-place
    masking of ``logits`` does not reach it)."""
    return torch.log_softmax(logits.float(), dim=-1)


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: list[int], num_top: int
) -> list[TokenLogprob]:
    """Row j of ``logprobs # [>= len(token_ids), V]`` scores ``token_ids[j]``.

    One host sync for the chosen values and one for the alternatives.
    """
    n = len(token_ids)
    if n == 0:
        return []
    rows = logprobs[:n]
    chosen = rows.gather(1, torch.tensor(token_ids, device=rows.device).view(n, 1))
    values = chosen.view(n).tolist()
    if num_top <= 0:
        return [TokenLogprob(t, v) for t, v in zip(token_ids, values, strict=True)]
    top_values, top_ids = rows.topk(min(num_top, rows.shape[-1]), dim=-1)
    tv, ti = top_values.tolist(), top_ids.tolist()
    return [
        TokenLogprob(t, v, tuple(zip(ti[j], tv[j], strict=True)))
        for j, (t, v) in enumerate(zip(token_ids, values, strict=True))
    ]
