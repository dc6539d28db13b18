"""The proposer's and the k controller's parts of an engine step (``llm_engine.py``): drafts
for the decoding requests, a draft model's pass over the prompts completed in the step, and
the step's measured costs for the controller."""

from __future__ import annotations

import time

from specserve.engine.outputs import StepStats
from specserve.engine.request import Request
from specserve.engine.scheduler import ScheduledRequest
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.prefill_budget import PrefillBudget, saving_per_token
from specserve.spec_decode.proposer import (
    Proposal,
    ProposeInput,
    Proposer,
    draft_cost_sample,
    report_verify_time,
)


def propose(
    proposer: Proposer | None,
    scheduled: list[ScheduledRequest],
    stats: StepStats,
    hidden_proposer: bool,
) -> list[Proposal]:
    """Drafts per scheduled request (empty for prefill chunks and k = 0); records each
    decoding request's k and the propose call's time in ``stats``. ``hidden_proposer``: the
    proposer drafts from the target's hidden states (a ``HiddenStateProposer``, which the
    engine decides once), so each input carries the rows it has not seen."""
    proposals = [Proposal([]) for _ in scheduled]
    if proposer is None:
        return proposals
    inputs, where = [], []
    for i, sr in enumerate(scheduled):
        if sr.samples and sr.request.is_decoding:
            stats.k_chosen.append(sr.num_lookahead)
            if sr.num_lookahead > 0:
                req = sr.request
                start, hidden = req.take_hidden() if hidden_proposer else (0, None)
                inputs.append(
                    ProposeInput(
                        req.request_id,
                        list(req.token_ids),
                        sr.num_lookahead,
                        req.params,
                        req.generator,
                        hidden_states=hidden,
                        hidden_start=start,
                    )
                )
                where.append(i)
    if inputs:
        t0 = time.perf_counter()
        for i, p in zip(where, proposer.propose(inputs), strict=True):
            assert len(p) <= scheduled[i].num_lookahead, "proposer drafted more than k"
            proposals[i] = p
        stats.draft_s = time.perf_counter() - t0
    return proposals


def prefill_drafts(
    proposer: Proposer | None,
    prompted: list[Request],
    stats: StepStats,
    controller: KController | None = None,
    budget: PrefillBudget | None = None,
    batch_size: int = 1,
) -> None:
    """Run the prompts of ``prompted`` (completed in this step, still running) through a
    draft model now, in the step that prefilled them on the target, as vLLM's draft-model
    proposer does; the next propose call then catches up one token.

    Left to the first propose call, this pass made a request's first decode step its longest
    and counted in the time per output token; here it counts in the time to the first token,
    as in ``specserve perf``'s loop (``benchmarks/server_step.py --loop``: the engine's TPOT
    went from 1.27x the loop's to 0.97x on the gguf pair). It is draft time
    (``StepStats.draft_s``), never a cost sample of the k controller (a step with a prompt is
    not recorded). Proposers without a prompt pass (n-gram, suffix, heads) skip it.

    With a ``budget`` and an adaptive ``controller`` (no fixed k), a request without a fixed
    k of its own whose output cap cannot repay its pass (``PrefillBudget.pays``, at the most
    a token can save by the controller's timings for ``batch_size`` requests) is not read: it
    decodes without drafts (``Request.drafts_off``). Each pass run is timed for the budget."""
    prefill = getattr(proposer, "prefill", None)
    if prefill is None or not prompted:
        return
    uncached = getattr(proposer, "uncached_tokens", None)
    judged = budget is not None and uncached is not None
    # the most a token can save: one figure for the step (None: not judged, every pass runs)
    saving = (
        saving_per_token(controller, batch_size)
        if judged and controller is not None and controller.fixed_k is None
        else None
    )
    t0 = time.perf_counter()
    for req in prompted:
        if req.drafts_off:  # left unread before (recomputed after a preemption): stays so
            continue
        prompt = req.token_ids[: req.num_computed_tokens]
        if budget is None or uncached is None:
            prefill(req.request_id, prompt)
            continue
        n = uncached(req.request_id, prompt)
        own_k = req.params.num_speculative_tokens is not None
        if not own_k and not budget.pays(n, req.num_output_tokens_left, saving):
            req.drafts_off = True
            stats.num_prompts_undrafted += 1
            continue
        start = time.perf_counter()
        prefill(req.request_id, prompt)
        budget.record(n, time.perf_counter() - start)
    stats.draft_s += time.perf_counter() - t0


def record_cost(
    controller: KController | None,
    proposer: Proposer | None,
    scheduled: list[ScheduledRequest],
    proposals: list[Proposal],
    stats: StepStats,
) -> None:
    """Feed the k controller (and a proposer that weighs costs, ``report_verify_time``) the
    measured costs of a pure decode/verify step (a step with a
    prefill chunk says nothing about decode cost, so it is not recorded; nor does the draft
    time of a propose call that caught up a lane left behind by k = 0 steps)."""
    if any(sr.num_new_tokens != 1 for sr in scheduled):
        return
    report_verify_time(proposer, stats.verify_s)
    if controller is None:
        return
    num_draft_steps = max(len(p) for p in proposals)
    draft_s, draft_steps = draft_cost_sample(proposer, stats.draft_s, num_draft_steps)
    controller.record_cost(
        draft_s,
        draft_steps,
        stats.verify_s,
        num_draft_steps + 1,
        batch_size=len(scheduled),
        step_s=stats.draft_s + stats.verify_s,
    )
