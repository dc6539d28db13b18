"""Spies on what a k controller is taught: the costs recorded and the proposer's catch-ups."""

from __future__ import annotations

from typing import Any

from specserve.spec_decode.k_controller import KController


def spy_costs_and_catch_ups(
    controller: KController, proposer: Any
) -> tuple[list[tuple[float, int, int]], list[int]]:
    """Wrap ``controller.record_cost`` and ``proposer.propose`` (a draft-model proposer) so
    that every recorded ``(draft_s, num_draft_steps, num_verified_tokens)`` and every propose
    call's ``last_catch_up_tokens`` are appended to the returned lists, in order."""
    recorded: list[tuple[float, int, int]] = []
    catch_ups: list[int] = []
    record, propose = controller.record_cost, proposer.propose

    def spy(draft_s, num_draft_steps, verify_s, num_verified_tokens, **kwargs):  # type: ignore[no-untyped-def]
        recorded.append((draft_s, num_draft_steps, num_verified_tokens))
        record(draft_s, num_draft_steps, verify_s, num_verified_tokens, **kwargs)

    def watch(batch):  # type: ignore[no-untyped-def]
        out = propose(batch)
        catch_ups.append(proposer.last_catch_up_tokens)
        return out

    controller.record_cost = spy  # type: ignore[method-assign]
    proposer.propose = watch
    return recorded, catch_ups
