"""The proposer contract: every drafting method (draft model, n-gram, suffix) speaks it.

A *proposer* looks at the committed tokens of each request in a batch and guesses the next
few tokens (the *draft*). The target model then verifies the draft in one forward pass
(``rejection_sampler.py``). Batches are *ragged*: each request asks for its own k and may get
fewer draft tokens back, even none (then the step is a plain decode step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specserve.sampling_params import SamplingParams


@dataclass
class ProposeInput:
    """One request's share of a propose call.

    Attributes:
        request_id: stable id; proposers with per-request state key it by this.
        token_ids: committed tokens: prompt + accepted output so far (the last one included,
            even though the target has not run it through its cache yet).
        num_draft_tokens: k for this step (>= 1).
        params: the request's sampling parameters (the draft applies the same processing).
        generator: the request's seeded generator, or None for the global one.
        hidden_states: for a proposer that drafts from the target's hidden states (one with
            ``target_hidden_layers``, see :class:`HiddenStateProposer`): ``# [n, features]``
            the target's captured hidden states of committed positions ``hidden_start ..
            hidden_start + n - 1`` not shown before (None: none new). Each row comes from a
            target forward the engine ran anyway (prefill or verify), never from an extra one.
        hidden_start: the position of ``hidden_states``' first row.
    """

    request_id: str
    token_ids: list[int]
    num_draft_tokens: int
    params: SamplingParams
    generator: torch.Generator | None = None
    hidden_states: torch.Tensor | None = None
    hidden_start: int = 0

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if not self.token_ids:
            raise ValueError(f"request {self.request_id!r} has no committed tokens")


@dataclass
class Proposal:
    """A draft for one request.

    Attributes:
        draft_token_ids: 0..k proposed tokens, in order.
        draft_probs: ``# [len(draft_token_ids), vocab]`` the processed draft distribution each
            token was sampled from; None means a deterministic (one-hot) draft.
    """

    draft_token_ids: list[int]
    draft_probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.draft_probs is not None:
            assert self.draft_probs.dim() == 2
            assert self.draft_probs.shape[0] == len(self.draft_token_ids)

    def __len__(self) -> int:
        return len(self.draft_token_ids)


# Committed tokens a model proposer catches up in a steady speculative step: the last draft
# token and the bonus token after a fully accepted draft. A proposer that had to catch up
# more (after steps with k = 0, when its lane fell behind) reports it in
# ``last_catch_up_tokens``: that call's time is a one-off burst, not the per-token cost of
# drafting, and the k controller does not learn the draft cost from it.
CATCH_UP_STEADY = 2


def draft_cost_sample(proposer: object, draft_s: float, num_draft_steps: int) -> tuple[float, int]:
    """The propose time and k that a step teaches the k controller: ``(draft_s,
    num_draft_steps)``, or ``(0.0, 0)`` (nothing learnt about drafting) when the latest
    propose call of ``proposer`` caught up more than :data:`CATCH_UP_STEADY` committed tokens.
    Such a call also ran the tokens of the k = 0 steps before it. Counted as k tokens'
    drafting, its time makes drafting look several times dearer than it is, and a controller
    that believes that stops drafting for good: every later probe is another burst.
    A proposer that reports ``last_num_forwards`` (its draft forwards in that call) is charged
    per forward run, not per token asked for; one that reports none drafted without its
    model (a hybrid's suffix drafts) and teaches nothing about the model's cost either: counted,
    its free drafts would make the model's look free, and k would grow past what pays."""
    if getattr(proposer, "last_catch_up_tokens", 0) > CATCH_UP_STEADY:
        return 0.0, 0
    # A proposer that stops early (a draft model's confidence stop) ran fewer forwards than
    # the k asked for; the time is theirs.
    forwards = getattr(proposer, "last_num_forwards", None)
    if num_draft_steps > 0 and forwards == 0:
        return 0.0, 0
    if num_draft_steps > 0 and forwards:
        return draft_s, min(num_draft_steps, forwards)
    return draft_s, num_draft_steps


def report_verify_time(proposer: object, verify_s: float) -> None:
    """Tell a proposer that weighs costs (``record_verify``: the hybrid) how long a decode
    step's verify took; others ignore it. Called by the loops after every pure decode step."""
    record = getattr(proposer, "record_verify", None)
    if record is not None:
        record(verify_s)


class Proposer(Protocol):
    """Drafts tokens for a batch of requests.

    ``propose`` returns one :class:`Proposal` per input, in order, each with at most
    ``num_draft_tokens`` tokens. ``release`` drops whatever state a finished, aborted or
    preempted request left behind (calling it for an unknown id is a no-op).
    """

    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]: ...

    def release(self, request_id: str) -> None: ...


@runtime_checkable
class HiddenStateProposer(Proposer, Protocol):
    """A proposer that drafts from the target's own hidden states (EAGLE, Medusa).

    ``target_hidden_layers`` names the hidden states it needs, in Hugging Face's
    ``hidden_states`` numbering (index i < num_layers: the residual stream entering layer i;
    index num_layers: the final normed output). The engine sets the target's
    ``capture_layers`` to it, buffers the captured rows of committed positions per request and
    hands them over in :attr:`ProposeInput.hidden_states`.
    """

    target_hidden_layers: tuple[int, ...]
