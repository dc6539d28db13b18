"""One place that turns a method name into a proposer (``--spec-method`` / ``SpecConfig``).

The engine builder, ``specserve generate``, ``specserve perf`` and the benchmarks all ask
here, so a new proposer is registered once.
"""

from __future__ import annotations

from torch import nn

from specserve.config import HEAD_METHODS
from specserve.models.decoder import DecoderLM
from specserve.models.eagle3 import Eagle3Head
from specserve.models.medusa import MedusaHeads
from specserve.spec_decode.draft_model import DraftModelProposer
from specserve.spec_decode.eagle import EagleProposer
from specserve.spec_decode.hybrid import HybridProposer
from specserve.spec_decode.medusa import MedusaProposer
from specserve.spec_decode.ngram import NgramProposer
from specserve.spec_decode.proposer import Proposer
from specserve.spec_decode.suffix import SuffixProposer

# Methods that draft with a second model (they need ``draft_model``).
DRAFT_MODEL_METHODS = ("draft", "hybrid")
# Methods that draft with a trained head over the target's hidden states (``target`` and
# ``head``).
METHODS = ("ngram", "suffix", *DRAFT_MODEL_METHODS, *HEAD_METHODS)


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
    target: DecoderLM | None = None,
    head: nn.Module | None = None,
    head_name: str = "",
    confidence_threshold: float = 0.0,
) -> Proposer:
    """The proposer for ``method``.

    Args:
        method: one of :data:`METHODS`.
        target_vocab_size: the target's vocabulary (a draft's extra rows are masked).
        draft_model: the draft decoder (methods in :data:`DRAFT_MODEL_METHODS`).
        max_model_len: longest sequence the draft's own KV cache must hold, drafts included.
        ngram_min / ngram_max: n-gram lengths matched by prompt lookup.
        max_num_seqs / block_size: the draft KV cache's lanes and block size (batched engine).
        target / head / head_name: the target decoder and the loaded head (methods in
            :data:`HEAD_METHODS`; ``loading/spec_heads.py`` loads heads), named in errors.
        confidence_threshold: a draft model's confidence stop (see ``draft_model.py``).
    Raises:
        ValueError: unknown method, a draft-model method without a draft model, a head
            method without its head (or with the other method's head).
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
            confidence_threshold=confidence_threshold,
        )
        return draft if method == "draft" else HybridProposer(SuffixProposer(), draft)
    if method in HEAD_METHODS:
        if target is None or head is None:
            raise ValueError(f"speculative method {method!r} needs the target and a trained head")
        if method == "eagle" and isinstance(head, Eagle3Head):
            return EagleProposer(target, head, head_name)
        if method == "medusa" and isinstance(head, MedusaHeads):
            return MedusaProposer(target, head, head_name)
        raise ValueError(
            f"speculative method {method!r} got a {type(head).__name__} head {head_name}; "
            f"it needs {'an EAGLE-3' if method == 'eagle' else 'a Medusa'} head"
        )
    raise ValueError(f"unknown speculative method {method!r}; known: {', '.join(METHODS)}")
