"""Suffix drafts where they have been accepted, the draft model otherwise.

Structured outputs (repeated lines, templated code) are where suffix matching drafts long
runs for free; open-ended text, counting and filled-in templates are where the trie drafts
confidently and wrongly, and a draft model guesses far better. The hybrid therefore asks the
suffix proposer first for every request and keeps, per request, a decayed *realised
acceptance rate* of each source: the suffix's from its drafts (also those it was not chosen
for, checked against the tokens the target committed afterwards: a free shadow evaluation),
the draft model's from the drafts it served. A request gets the suffix draft when it is at
least ``min_suffix_tokens`` long (or k, when k is smaller), the suffix's rate is within
``suffix_margin`` of the draft model's (a suffix draft costs nothing, so it may be a bit
worse), and it is no shorter than the tokens the draft model's k-token draft is expected to
get accepted at its rate (:func:`expected_accepted`: on prose the trie's matches are a
token or two where the draft model's drafts are accepted whole); every other request falls
back to the draft model, in one batched draft call. The
draft model keeps its own KV cache in step lazily (``DraftModelProposer`` rolls back and
catches up on each call), so steps it skips cost it nothing but a longer catch-up later.

Once the step's costs are known the choice weighs them instead of the last two conditions:
the loop that verifies reports each step's verify time (:meth:`HybridProposer.record_verify`,
through ``proposer.report_verify_time``), the hybrid times its own draft-model calls (their
catch-ups included), and a request gets the suffix draft whenever its expected tokens per
second, ``(1 + accepted) / verify``, are no lower than the draft model's, ``(1 + the model's
mean accepted tokens per draft) / (verify + draft call)``. Rates alone kept handing the
step to the model wherever its drafts were accepted a little more often: on a structured
prompt a 4-token suffix draft gave way to an 8-token model draft that cost two target
steps' time to make, and the hybrid ran at 0.7x the n-gram proposer's speed there
(docs/benchmarks.md).

The idea of combining a model-free suffix proposer with a model-based one comes from
SuffixDecoding (Oliaro et al., 2024).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.spec_decode.draft_model import DraftModelProposer
from specserve.spec_decode.proposer import Proposal, ProposeInput
from specserve.spec_decode.suffix import SuffixProposer


@dataclass
class _SourceRate:
    """Decayed counts of drafted tokens whose outcome was seen, of accepted ones, and of the
    drafts they came in."""

    accepted: float
    tried: float
    drafts: float = 0.0  # the prior's pseudo-counts are tokens, not drafts
    draft_accepted: float = 0.0

    @property
    def rate(self) -> float:
        return self.accepted / self.tried

    def accepted_per_draft(self, k: int) -> float:
        """Mean accepted tokens of this source's scored drafts; before one was scored, the
        geometric sum of its rate over ``k`` positions."""
        if self.drafts < 0.5:
            return expected_accepted(self.rate, k)
        return self.draft_accepted / self.drafts

    def observe(self, draft: Sequence[int], committed: Sequence[int], decay: float) -> None:
        """Score ``draft`` against the tokens committed after it was made: positions up to
        the first mismatch count (the verifier stops there); positions past the committed
        tokens are unknown and not counted."""
        tried = accepted = 0
        for drafted, actual in zip(draft, committed, strict=False):
            tried += 1
            if drafted != actual:
                break
            accepted += 1
        if tried:
            self.accepted = self.accepted * decay + accepted
            self.tried = self.tried * decay + tried
            self.drafts = self.drafts * decay + 1
            self.draft_accepted = self.draft_accepted * decay + accepted


def expected_accepted(rate: float, k: int) -> float:
    """Tokens a draft of ``k`` is expected to get accepted when each position is accepted
    with probability ``rate`` given the ones before it: ``rate + rate² + ... + rate^k``."""
    return sum(rate**i for i in range(1, k + 1))


@dataclass
class _Pending:
    """A request's drafts of its last step, scored at its next one."""

    context_len: int
    suffix: list[int]
    model: list[int] | None  # the draft model's draft, when it served the step


@dataclass
class _RequestState:
    suffix: _SourceRate
    model: _SourceRate
    pending: _Pending | None = None
    model_share: float = 1.0  # decayed share of its steps the draft model served


class HybridProposer:
    """Suffix first, draft model as the fallback (see the module docstring).

    Args:
        suffix: the model-free proposer asked first.
        draft: the draft-model proposer used where the suffix draft is short or unreliable.
        min_suffix_tokens: a suffix draft shorter than this (and than k) is never used.
        suffix_margin: the suffix is used while its acceptance rate >= the model's - this.
        decay: per-step decay of the acceptance counts (recent steps weigh more).
        prior_weight: pseudo-observations behind each source's starting rate.
        suffix_prior: the suffix's starting rate (the model's is 1). Optimistic (1), one- and
            two-token trie matches on prose took steps from the draft model at the start of
            a request and were rejected: the hybrid ran 4 % below the draft-model method on
            an open-ended prompt (docs/benchmarks.md).
        cost_decay: weight of the past in the running means of the verify and draft-call
            times (each new time weighs ``1 - cost_decay``).
    """

    def __init__(
        self,
        suffix: SuffixProposer,
        draft: DraftModelProposer,
        min_suffix_tokens: int = 2,
        suffix_margin: float = 0.1,
        decay: float = 0.8,
        prior_weight: float = 2.0,
        suffix_prior: float = 0.5,
        cost_decay: float = 0.8,
    ) -> None:
        if min_suffix_tokens < 1:
            raise ValueError(f"min_suffix_tokens must be >= 1, got {min_suffix_tokens}")
        if not 0.0 <= suffix_margin <= 1.0:
            raise ValueError(f"suffix_margin must be in [0, 1], got {suffix_margin}")
        if not 0.0 < decay <= 1.0 or prior_weight <= 0:
            raise ValueError(
                f"need 0 < decay <= 1 and prior_weight > 0, got {decay}, {prior_weight}"
            )
        if not 0.0 < suffix_prior <= 1.0:
            raise ValueError(f"suffix_prior must be in (0, 1], got {suffix_prior}")
        if not 0.0 <= cost_decay < 1.0:
            raise ValueError(f"cost_decay must be in [0, 1), got {cost_decay}")
        self.suffix = suffix
        self.draft = draft
        self.min_suffix_tokens = min_suffix_tokens
        self.suffix_margin = suffix_margin
        self.decay = decay
        self.prior_weight = prior_weight
        self.num_suffix_drafts = 0  # requests served by the suffix trie (for stats/tests)
        self.num_model_drafts = 0  # requests that fell back to the draft model
        self.cost_decay = cost_decay
        self.suffix_prior = suffix_prior
        self.verify_s: float | None = None  # running mean of a step's verify time
        self.model_call_s: float | None = None  # ... and of a draft-model call's time
        self._requests: dict[str, _RequestState] = {}

    def _mean(self, old: float | None, new: float) -> float:
        return new if old is None else self.cost_decay * old + (1 - self.cost_decay) * new

    def record_verify(self, verify_s: float) -> None:
        """A step's verify time (the target forward and the acceptance), from the loop."""
        if verify_s > 0:
            self.verify_s = self._mean(self.verify_s, verify_s)

    def _model_serves(self, inp: ProposeInput, suffix: Proposal, st: _RequestState) -> bool:
        """Whether request ``inp`` falls back to the draft model (the module docstring)."""
        k = inp.num_draft_tokens
        if len(suffix) < min(self.min_suffix_tokens, k):
            return True
        if self.verify_s is not None and self.model_call_s is not None:
            from_suffix = 1 + expected_accepted(st.suffix.rate, len(suffix))
            from_model = 1 + st.model.accepted_per_draft(k)
            return from_suffix * (self.verify_s + self.model_call_s) < from_model * self.verify_s
        less_reliable = st.suffix.rate + self.suffix_margin < st.model.rate
        return less_reliable or len(suffix) < expected_accepted(st.model.rate, k)

    def _state(self, inp: ProposeInput) -> _RequestState:
        state = self._requests.get(inp.request_id)
        if state is None:
            # The model starts at an optimistic rate, the suffix at ``suffix_prior``: a fresh
            # request's trie matches are trusted once its drafts (shadow-scored every step)
            # have been accepted.
            w = self.prior_weight
            state = _RequestState(_SourceRate(w * self.suffix_prior, w), _SourceRate(w, w))
            self._requests[inp.request_id] = state
        pending = state.pending
        if pending is not None and len(inp.token_ids) > pending.context_len:
            committed = inp.token_ids[pending.context_len :]
            state.suffix.observe(pending.suffix, committed, self.decay)
            if pending.model is not None:
                state.model.observe(pending.model, committed, self.decay)
        state.pending = None  # (a preempted/rolled-back request simply scores nothing)
        return state

    def suffix_rate(self, request_id: str) -> float | None:
        """The request's current suffix acceptance estimate (None before its first call)."""
        state = self._requests.get(request_id)
        return None if state is None else state.suffix.rate

    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        proposals = self.suffix.propose(batch)
        states = [self._state(inp) for inp in batch]
        fallback = [
            i
            for i, (inp, prop, st) in enumerate(zip(batch, proposals, states, strict=True))
            if self._model_serves(inp, prop, st)
        ]
        self.num_suffix_drafts += len(batch) - len(fallback)
        self.num_model_drafts += len(fallback)
        self.draft.last_catch_up_tokens = self.draft.last_num_forwards = 0
        drafted = []
        if fallback:
            t0 = time.perf_counter()
            drafted = self.draft.propose([batch[i] for i in fallback])
            self.model_call_s = self._mean(self.model_call_s, time.perf_counter() - t0)
        model_drafts = dict(zip(fallback, drafted, strict=True))
        for i, (inp, st) in enumerate(zip(batch, states, strict=True)):
            model = model_drafts.get(i)
            served = 0.0 if model is None else 1.0
            st.model_share = self.decay * st.model_share + (1 - self.decay) * served
            st.pending = _Pending(
                len(inp.token_ids),
                list(proposals[i].draft_token_ids),
                None if model is None else list(model.draft_token_ids),
            )
            if model is not None:
                proposals[i] = model
        return proposals

    def draft_cost_scale(self, request_id: str) -> float:
        """The share of its recent steps the draft model served for the request (1 before
        its first): the k controller scales the draft model's cost by it
        (``KController.draft_cost_scale``), since suffix drafts cost nothing."""
        state = self._requests.get(request_id)
        return 1.0 if state is None else state.model_share

    def prefill(self, request_id: str, prompt_ids: list[int]) -> None:
        """The draft model's prompt pass, ahead of the first propose (as for the draft-model
        method): without it the first draft-model call of a request caught up the whole
        prompt inside the decode."""
        self.draft.prefill(request_id, prompt_ids)

    @property
    def last_catch_up_tokens(self) -> int:
        """The draft model's catch-up in the latest propose call (0 when it did not run)."""
        return self.draft.last_catch_up_tokens

    @property
    def last_num_forwards(self) -> int:
        """The draft model's forwards in the latest propose call (0 when it did not run)."""
        return self.draft.last_num_forwards

    def release(self, request_id: str) -> None:
        self.suffix.release(request_id)
        self.draft.release(request_id)
        self._requests.pop(request_id, None)
