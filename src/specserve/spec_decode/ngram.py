"""Prompt lookup ("n-gram") drafting: copy what followed the last time the context's
tail appeared earlier in the request's own tokens (prompt + output so far).

Terms:
    tail: the last n committed tokens, n in [n_min, n_max]; longer tails are tried first.
    match: the most recent earlier occurrence of the tail (it must end before the last token).
    draft: the k tokens that followed the match. When the match is so recent that fewer than
        k tokens follow it, copying continues into the draft itself (like an LZ77 copy with
        overlap), which extends a repeating pattern: after ``a b a b`` the tail ``a b`` matches
        at 0 and drafts ``a b a b ...``.

The most recent match is preferred because repetition in generated text is local (lists,
repeated lines, code edits of the lines just shown).
"""

from __future__ import annotations

from collections.abc import Sequence

from specserve.spec_decode.proposer import Proposal, ProposeInput


def find_ngram_draft(tokens: Sequence[int], n_min: int, n_max: int, k: int) -> list[int]:
    """Draft up to ``k`` tokens by prompt lookup (see the module docstring).

    Returns [] when no tail of length n_min..n_max occurs earlier.
    """
    if not (1 <= n_min <= n_max):
        raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    num = len(tokens)
    if k == 0:
        return []
    seq = list(tokens)
    for n in range(min(n_max, num - 1), n_min - 1, -1):
        tail = seq[num - n :]
        last = tail[-1]
        # Candidate match ends at index `end` (exclusive), end <= num - 1, searching backwards.
        for end in range(num - 1, n - 1, -1):
            if seq[end - 1] != last or seq[end - n : end] != tail:
                continue
            draft: list[int] = []
            for i in range(k):
                idx = end + i  # past the committed tokens, copy from the draft itself
                draft.append(seq[idx] if idx < num else draft[idx - num])
            return draft
    return []


class NgramProposer:
    """Prompt-lookup proposer; stateless, so ``release`` has nothing to drop.

    Args:
        n_min: shortest tail matched.
        n_max: longest tail matched (tried first).
    """

    def __init__(self, n_min: int = 2, n_max: int = 4) -> None:
        if not (1 <= n_min <= n_max):
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min = n_min
        self.n_max = n_max

    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        return [
            Proposal(find_ngram_draft(inp.token_ids, self.n_min, self.n_max, inp.num_draft_tokens))
            for inp in batch
        ]

    def release(self, request_id: str) -> None:
        return None
