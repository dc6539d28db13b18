"""One place that turns a method name into a proposer (``--spec-method`` / ``SpecConfig``).

The engine builder, ``specserve generate``, ``specserve perf`` and the benchmarks all ask
here, so a new proposer is registered once.
"""

from __future__ import annotations

from specserve.models.decoder import DecoderLM
from specserve.spec_decode.draft_model import DraftModelProposer
from specserve.spec_decode.hybrid import HybridProposer
from specserve.spec_decode.ngram import NgramProposer
from specserve.spec_decode.proposer import Proposer
from specserve.spec_decode.suffix import SuffixProposer

# Methods that draft with a second model (they need ``draft_model``).
DRAFT_MODEL_METHODS = ("draft", "hybrid")
METHODS = ("ngram", "suffix", *DRAFT_MODEL_METHODS)


def make_proposer(
    method: str,
    target_vocab_size: int,
    draft_model: DecoderLM | None = None,
    *,
    max_model_len: int = 4096,
    ngram_min: int = 2,
    ngram_max: int = 4,
    max_num_seqs: int = 1,
    block_size: int = 16,
) -> Proposer:
    """The proposer for ``method``.

    Args:
        method: one of :data:`METHODS`.
        target_vocab_size: the target's vocabulary (a draft's extra rows are masked).
        draft_model: the draft decoder (methods in :data:`DRAFT_MODEL_METHODS`).
        max_model_len: longest sequence the draft's own KV cache must hold, drafts included.
        ngram_min / ngram_max: n-gram lengths matched by prompt lookup.
        max_num_seqs / block_size: the draft KV cache's lanes and block size (batched engine).
    Raises:
        ValueError: unknown method, or a draft-model method without a draft model.
    """
    if method == "ngram":
        return NgramProposer(ngram_min, ngram_max)
    if method == "suffix":
        return SuffixProposer()
    if method in DRAFT_MODEL_METHODS:
        if draft_model is None:
            raise ValueError(f"speculative method {method!r} needs a draft model")
        draft = DraftModelProposer(
            draft_model,
            target_vocab_size,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            block_size=block_size,
        )
        return draft if method == "draft" else HybridProposer(SuffixProposer(), draft)
    raise ValueError(f"unknown speculative method {method!r}; known: {', '.join(METHODS)}")
