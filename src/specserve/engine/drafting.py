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


def read_prompts(
    proposer: Proposer | None,
    prompted: list[Request],
    reading: list[Request],
    stats: StepStats,
    controller: KController | None = None,
    budget: PrefillBudget | None = None,
    batch_size: int = 1,
) -> None:
    """Run prompts through a draft model: those of ``prompted`` (completed in this step, still
    running), in the step that prefilled them on the target, as vLLM's draft-model proposer
    does, so the next propose call catches up one token; and a chunk more of each request of
    ``reading`` (decoding, ``Request.draft_reading``), oldest first.

    Left to the first propose call, this pass made a request's first decode step its longest
    and counted in the time per output token; here it counts in the time to the first token,
    as in ``specserve perf``'s loop (``benchmarks/server_step.py --loop``: the engine's TPOT
    went from 1.27x the loop's to 0.97x on the gguf pair). It is draft time
    (``StepStats.draft_s``), never a cost sample of the k controller (the engine records the
    step's costs before this runs). Proposers without a prompt pass (n-gram, suffix, heads)
    skip it.

    With a ``budget`` and an adaptive ``controller`` (no fixed k), a request without a fixed k
    of its own is weighed (``PrefillBudget.first_pass``, at the most a token can save by the
    controller's timings for ``batch_size`` requests): its prompt is read at once, or a chunk
    now and the rest in later steps while it decodes plainly (``draft_reading``), or never
    (``drafts_off``, also where the pass left to a reading request can no longer be repaid).
    A reading step's chunks together run ``PrefillBudget.chunk`` tokens. Each pass is timed
    for the budget."""
    prefill = getattr(proposer, "prefill", None)
    if prefill is None or not (prompted or reading):
        return
    uncached = getattr(proposer, "uncached_tokens", None)
    if budget is None or uncached is None:  # every prompt at once, untimed
        t0 = time.perf_counter()
        for req in prompted:
            prefill(req.request_id, req.token_ids[: req.num_computed_tokens])
        stats.draft_s += time.perf_counter() - t0
        return
    adaptive = controller is not None and controller.fixed_k is None
    # the most a token can save and a plain step's time: one figure each for the step
    saving = plain = None
    if adaptive:
        assert controller is not None
        saving = saving_per_token(controller, batch_size)
        if controller.plain_cost_measured(batch_size):
            plain = controller.verify_cost(1, batch_size)

    def run(req: Request, tokens: list[int], uncached_now: int, num_tokens: int) -> None:
        """Run ``num_tokens`` of the ``uncached_now`` tokens the lane lacks; time them."""
        assert budget is not None
        start = time.perf_counter()
        left = prefill(req.request_id, tokens, max_tokens=num_tokens)
        budget.record(uncached_now - left, time.perf_counter() - start)
        req.draft_reading = left > 0

    def undrafted(req: Request) -> None:
        req.drafts_off, req.draft_reading = True, False
        stats.num_prompts_undrafted += 1

    t0 = time.perf_counter()
    for req in prompted:
        if req.drafts_off:  # left unread before (recomputed after a preemption): stays so
            continue
        prompt = req.token_ids[: req.num_computed_tokens]
        n = uncached(req.request_id, prompt)
        first = (
            budget.first_pass(n, req.num_output_tokens_left, saving, plain)
            if adaptive and req.params.num_speculative_tokens is None
            else n
        )
        if first is None:
            undrafted(req)
            continue
        run(req, prompt, n, first)
        stats.num_prompts_chunked += int(req.draft_reading)
    allowance = budget.chunk(plain)
    for req in reading:
        if allowance <= 0:
            break
        n = uncached(req.request_id, req.token_ids)
        if saving is not None and not budget.pays(n, req.num_output_tokens_left, saving):
            undrafted(req)
            assert proposer is not None
            proposer.release(req.request_id)  # the lane, and what it read, serve others
            continue
        run(req, req.token_ids, n, min(n, allowance))
        allowance -= min(n, allowance)
    stats.draft_s += time.perf_counter() - t0


def record_cost(
    controller: KController | None,
    proposer: Proposer | None,
    scheduled: list[ScheduledRequest],
    proposals: list[Proposal],
    stats: StepStats,
    num_step_tokens: int | None = None,
) -> None:
    """Feed the k controller (and a proposer that weighs costs, ``report_verify_time``) the
    measured costs of a pure decode/verify step (a step with a prefill chunk says nothing
    about decode cost, so it is not recorded; nor does the draft time of a propose call that
    caught up a lane left behind by k = 0 steps). ``num_step_tokens``: the token rows its
    forward ran, padding included (``ModelRunner.last_num_tokens``; None: every request
    padded to the longest)."""
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
        num_step_tokens=num_step_tokens,
    )
