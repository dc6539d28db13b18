"""Drafting runs: what sets how often the k controller (``k_controller.py``) probes a
request that decodes plainly.

A *probe's run* is a request's steps from a probe (its start probe, or a probe after plain
steps) to its next k = 0, or its first ``judge_after`` timed steps if it lasts longer. It is
judged by the tokens its steps committed against their measured wall time, a draft model's
catch-up over the tokens of earlier plain steps included, and the time a plain step of the
same batch size costs. A run that the controller followed (more than the probe's own step)
and that beat plain decoding resets the request's probe backoff factor to 1; any other
doubles it (up to the controller's maximum), whether its drafts were rejected or accepted.
A new request starts from the factor the latest judged run left (the *shared* factor).
Drafting the controller chose from its estimates, not as a probe, leaves the factor alone.

Counting the run's measured time matters where a draft model's catch-up is dear: a probe's
drafts are often accepted on prose, and the few drafting steps they lead to lose to plain
decoding once the catch-up is paid; judged by the controller's next choice alone, such probes
reset the factor, and a request paid a catch-up probe every 16 plain steps. Replayed on
recorded traces of the gguf pair with a catch-up of 6-12 ms a token (``benchmarks/k_replay.py
--catch-up-ms``), the adaptive arm without a confidence stop went from 0.91-0.95x of plain
to 0.98x on open-ended text (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class ProbeState:
    """One request's probe schedule and current drafting run."""

    backoff: int = 1  # the probe interval's current factor
    plain_steps: int = 0  # consecutive steps with k = 0
    drafting_steps: int = 0  # steps with k > 0 since the last reach probe
    started: bool = False  # its first step was chosen (a start probe, drafting or plain)
    batch_size: int = 1  # of its last choice
    probing: bool = False  # the k just chosen is a probe (at the start or after plain steps)
    run: str = ""  # the current drafting run: "open" (measured), "closed" or "" (none)
    run_steps: int = 0
    run_tokens: int = 0  # committed by the run's timed steps
    run_cost: float = 0.0  # the measured seconds of those steps
    pending_tokens: int = 0  # observed in the step whose time is not recorded yet


class DraftingRuns:
    """The drafting runs of all requests and the shared backoff factor (module docstring).

    Args:
        plain_cost: seconds of a plain step of a batch size (asked only when judging).
        max_backoff: largest backoff factor.
        judge_after: a run still drafting after this many timed steps is judged then.
    """

    def __init__(
        self, plain_cost: Callable[[int], float], max_backoff: int, judge_after: int
    ) -> None:
        self.plain_cost = plain_cost
        self.max_backoff = max_backoff
        self.judge_after = judge_after
        self.shared_backoff = 1
        self._pending: dict[str, ProbeState] = {}  # observed in a run, step not timed yet

    def new_state(self) -> ProbeState:
        return ProbeState(backoff=self.shared_backoff)

    def observed(self, request_id: str, state: ProbeState, num_tokens: int) -> None:
        """A verify step of the request committed ``num_tokens``; its time comes with
        :meth:`timed`."""
        if state.run == "open":
            state.pending_tokens = num_tokens
            self._pending[request_id] = state

    def timed(self, step_s: float) -> None:
        """The step just observed took ``step_s``: charged to each run observed in it."""
        for state in self._pending.values():
            state.run_steps += 1
            state.run_tokens += state.pending_tokens
            state.run_cost += step_s
            state.pending_tokens = 0
        self._pending.clear()

    def chosen(self, request_id: str, state: ProbeState, k: int, batch: int) -> None:
        """The controller chose k for the request's next step in a batch of ``batch``
        requests. Opens, closes or judges its run (against a plain step of that batch)."""
        if self._pending.pop(request_id, None) is not None:  # observed, never timed (its
            state.pending_tokens = 0  # step ran a prompt chunk): that step does not count
        if k == 0:
            if state.run == "open":
                self._judge(state, batch)
            state.run = ""
        elif not state.run:  # only a probe's run is judged
            state.run = "open" if state.probing else "closed"
            state.run_steps, state.run_tokens, state.run_cost = 0, 0, 0.0
        elif state.run == "open" and state.run_steps >= self.judge_after:
            self._judge(state, batch)
        state.batch_size = batch

    def released(self, request_id: str, state: ProbeState) -> None:
        """The request finished: an open run is judged on its timed steps (against a plain
        step of the batch size of its last choice)."""
        self._pending.pop(request_id, None)
        if state.run == "open":
            self._judge(state, state.batch_size)

    def _judge(self, state: ProbeState, batch: int) -> None:
        state.run = "closed"
        if state.run_steps == 0:  # nothing timed: nothing learnt
            return
        plain_s = self.plain_cost(batch)
        paid = state.run_steps > 1 and state.run_tokens * plain_s > state.run_cost
        grown = min(2 * state.backoff, self.max_backoff)
        state.backoff = self.shared_backoff = 1 if paid else grown
