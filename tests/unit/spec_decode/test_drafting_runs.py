"""Drafting runs: judged on their timed steps against plain decoding; the backoff they leave."""

from __future__ import annotations

from specserve.spec_decode.drafting_runs import DraftingRuns, ProbeState


def _step(
    runs: DraftingRuns,
    state: ProbeState,
    k: int,
    tokens: int,
    step_s: float | None,
    probe: bool = False,
) -> None:
    """Choose k (a probe or not; the runs' plain step costs 0.2 s), then observe and, unless
    None, time the step."""
    state.probing = probe
    runs.chosen("r", state, k, 1)
    if k:
        runs.observed("r", state, tokens)
    if step_s is not None:
        runs.timed(step_s)


def test_a_probe_run_that_beats_plain_resets_the_backoff_and_one_that_loses_doubles_it() -> None:
    runs = DraftingRuns(lambda batch: 0.2, max_backoff=8, judge_after=16)
    state = runs.new_state()
    state.backoff = 4
    _step(runs, state, 2, 3, 0.25, probe=True)  # 3 tokens in 0.25 s: plain would take 0.6 s
    _step(runs, state, 2, 3, 0.25)
    _step(runs, state, 0, 0, 0.2)  # the run ends and is judged
    assert state.backoff == runs.shared_backoff == 1
    _step(runs, state, 2, 3, 0.7, probe=True)  # a probe with a catch-up: accepted, but 0.7 s
    _step(runs, state, 1, 1, 0.3)  # then a rejected draft
    _step(runs, state, 0, 0, None)
    assert state.backoff == runs.shared_backoff == 2
    assert runs.new_state().backoff == 2  # a new request starts from it
    for _ in range(3):  # up to the maximum
        _step(runs, state, 1, 1, 0.3, probe=True)
        _step(runs, state, 1, 1, 0.3)
        _step(runs, state, 0, 0, 0.2)
    assert state.backoff == 8


def test_a_probe_the_controller_does_not_follow_backs_off_even_when_it_paid() -> None:
    # k = 0 right after the probe: its estimates still say drafting does not pay.
    runs = DraftingRuns(lambda batch: 0.2, max_backoff=8, judge_after=16)
    state = runs.new_state()
    _step(runs, state, 2, 3, 0.25, probe=True)
    _step(runs, state, 0, 0, 0.2)
    assert state.backoff == 2


def test_runs_not_started_by_a_probe_are_not_judged() -> None:
    runs = DraftingRuns(lambda batch: 0.2, max_backoff=8, judge_after=2)
    state = runs.new_state()
    state.backoff = 4
    for _ in range(4):  # drafting because the estimates say so, losing
        _step(runs, state, 2, 1, 0.5)
    _step(runs, state, 0, 0, 0.2)
    assert state.backoff == 4 and runs.shared_backoff == 1


def test_a_step_never_timed_counts_neither_its_tokens_nor_the_next_steps_time() -> None:
    runs = DraftingRuns(lambda batch: 0.2, max_backoff=8, judge_after=16)
    state = runs.new_state()
    _step(runs, state, 4, 1, 0.5, probe=True)  # 1 token in 0.5 s
    _step(runs, state, 4, 5, None)  # 5 tokens, but a prompt chunk ran beside: not timed
    _step(runs, state, 4, 1, 0.5)
    _step(runs, state, 0, 0, 0.2)
    assert (state.run_steps, state.run_tokens) == (2, 2) and state.run_cost == 1.0
    assert state.backoff == 2  # 2 tokens in 1 s: lost


def test_long_runs_are_judged_once_and_untimed_runs_not_at_all() -> None:
    runs = DraftingRuns(lambda batch: 0.2, max_backoff=8, judge_after=3)
    state = runs.new_state()
    state.backoff = 8
    _step(runs, state, 4, 5, 0.4, probe=True)
    for _ in range(3):  # judged at the choice after its 3rd timed step
        _step(runs, state, 4, 5, 0.4)
    assert state.run == "closed" and state.backoff == 1
    state.backoff = 8
    _step(runs, state, 4, 1, 0.4)  # the same run goes on losing: not judged again
    _step(runs, state, 0, 0, 0.2)
    assert state.backoff == 8
    _step(runs, state, 1, 1, None, probe=True)  # a run whose only step was never timed
    runs.released("r", state)
    assert state.backoff == 8 and runs.shared_backoff == 1


def test_a_finished_request_judges_its_open_run() -> None:
    runs = DraftingRuns(lambda batch: 0.2, max_backoff=8, judge_after=16)
    state = runs.new_state()
    _step(runs, state, 1, 1, 0.3, probe=True)
    _step(runs, state, 1, 1, 0.3)
    runs.released("r", state)
    assert runs.shared_backoff == 2
    assert runs.new_state().backoff == 2
