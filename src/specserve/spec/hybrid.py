"""Suffix drafts when the suffix trie is confident, the draft model otherwise.

Structured outputs (repeated lines, counting, templated JSON) are where suffix matching
drafts long runs for free; open-ended text is where it finds nothing and a draft model still
guesses well. The hybrid asks the suffix proposer first for every request and falls back to
the draft model only for requests whose suffix draft is shorter than ``min_suffix_tokens``
(or than k, when k is smaller), in one batched draft call. The draft model keeps its own KV
cache in step lazily (``DraftModelProposer`` rolls back and catches up on each call), so
steps it skips cost it nothing but a longer catch-up later. The idea of combining a
model-free suffix proposer with a model-based one comes from SuffixDecoding
(Oliaro et al., 2024).
"""

from __future__ import annotations

from collections.abc import Sequence

from specserve.spec.draft_model import DraftModelProposer
from specserve.spec.proposer import Proposal, ProposeInput
from specserve.spec.suffix import SuffixProposer


class HybridProposer:
    """Suffix first, draft model as the fallback (see the module docstring).

    Args:
        suffix: the model-free proposer asked first.
        draft: the draft-model proposer used where the suffix draft is too short.
        min_suffix_tokens: a suffix draft at least this long (or as long as k) is used as is.
    """

    def __init__(
        self, suffix: SuffixProposer, draft: DraftModelProposer, min_suffix_tokens: int = 2
    ) -> None:
        if min_suffix_tokens < 1:
            raise ValueError(f"min_suffix_tokens must be >= 1, got {min_suffix_tokens}")
        self.suffix = suffix
        self.draft = draft
        self.min_suffix_tokens = min_suffix_tokens
        self.num_suffix_drafts = 0  # requests served by the suffix trie (for stats/tests)
        self.num_model_drafts = 0  # requests that fell back to the draft model

    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        proposals = self.suffix.propose(batch)
        fallback = [
            i
            for i, (inp, prop) in enumerate(zip(batch, proposals, strict=True))
            if len(prop) < min(self.min_suffix_tokens, inp.num_draft_tokens)
        ]
        self.num_suffix_drafts += len(batch) - len(fallback)
        self.num_model_drafts += len(fallback)
        if fallback:
            drafted = self.draft.propose([batch[i] for i in fallback])
            for i, prop in zip(fallback, drafted, strict=True):
                proposals[i] = prop
        return proposals

    def release(self, request_id: str) -> None:
        self.suffix.release(request_id)
        self.draft.release(request_id)
