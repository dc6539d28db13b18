"""Whether a draft model's prompt pass can pay for itself (spec_decode/prefill_budget.py): the
measured cost per token, the test against what the output cap can save, and the saving per
token the k controller's estimates give."""

from __future__ import annotations

import pytest

from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.prefill_budget import PrefillBudget, saving_per_token


def test_the_cost_per_token_is_averaged_over_passes_long_enough_to_time() -> None:
    budget = PrefillBudget(ema=0.5, min_tokens=10, min_chunk=10)
    budget.record(5, 100.0)  # too short to say anything
    assert budget.seconds_per_token is None
    budget.record(100, 1.0)
    assert budget.seconds_per_token == pytest.approx(0.01)
    budget.record(10, 0.3)
    assert budget.seconds_per_token == pytest.approx(0.02)
    bad_settings = (
        {"ema": 0.0},
        {"ema": 1.5},
        {"min_tokens": 0},
        {"min_chunk": 0},
        {"min_chunk": 65},  # over min_tokens
        {"upfront_tokens": -1},
        {"step_share": 0.0},
    )
    for bad in bad_settings:
        with pytest.raises(ValueError):
            PrefillBudget(**bad)  # type: ignore[arg-type]


def test_a_pass_runs_unless_its_measured_cost_exceeds_what_the_output_can_save() -> None:
    budget = PrefillBudget(min_tokens=64)
    assert budget.pays(3000, 1, 0.0)  # nothing measured yet: the engine reads every prompt
    budget.record(1000, 4.0)  # 4 ms a token
    assert budget.pays(3000, 64, None)  # the saving is not known yet
    assert budget.pays(63, 1, 0.0)  # short passes always run
    # 3000 tokens cost 12 s: 64 tokens saving 30 ms each repay 1.9 s, 500 tokens 15 s
    assert not budget.pays(3000, 64, 0.03)
    assert budget.pays(3000, 500, 0.03)
    assert not budget.pays(3000, 10_000, 0.0)  # speculation saves nothing here
    assert budget.pays(0, 0, 0.0)  # a prompt the lanes hold costs nothing


def test_a_new_prompt_is_read_at_once_a_chunk_a_step_or_never() -> None:
    """What runs in the step that samples the first token: a short prompt, all of it; a
    pass the first ``upfront_tokens`` output tokens repay, all of it; a pass only a longer
    answer repays, a chunk costing ``step_share`` of a plain step (the rest in later steps);
    a pass the cap cannot repay, nothing; and a timed first chunk while the cost is unknown."""
    budget = PrefillBudget(min_tokens=64, upfront_tokens=32, step_share=1.0, min_chunk=16)
    assert budget.first_pass(3000, 512, 0.05, 0.1) == 64  # cost unknown: time a first chunk
    assert budget.first_pass(40, 1, 0.0, None) == 40  # short: at once
    budget.record(1000, 3.0)  # 3 ms a token
    assert budget.chunk(0.1) == 33  # a plain step of 100 ms: 33 tokens of 3 ms
    assert budget.chunk(0.01) == 16 and budget.chunk(None) == 64
    # 500 tokens cost 1.5 s; 32 tokens saving 50 ms repay 1.6 s: at once
    assert budget.first_pass(500, 512, 0.05, 0.1) == 500
    # 3000 tokens cost 9 s: 512 tokens repay 25.6 s, the first 32 only 1.6 s: a chunk
    assert budget.first_pass(3000, 512, 0.05, 0.1) == 33
    assert budget.first_pass(3000, 64, 0.05, 0.1) is None  # 64 tokens repay 3.2 s: never
    assert budget.first_pass(3000, 512, None, None) == 64  # no plain step timed: chunks


def timed_controller(draft_s: float, accepted: int) -> KController:
    """A controller that has timed plain steps (100 ms) and 5-token verifies (130 ms) after
    drafts of 4 tokens costing ``draft_s`` each, of which ``accepted`` were kept."""
    controller = KController(k_max=4, prior_weight=0.5)
    for _ in range(6):
        controller.record_cost(0.0, 0, 0.100, 1)
        controller.observe("old", 4, accepted, 4)
        controller.record_cost(4 * draft_s, 4, 0.130, 5)
    return controller


def test_the_saving_per_token_is_the_best_case_of_the_timed_steps() -> None:
    """A plain step's time less that of a step whose drafts are all accepted, per token; the
    acceptance seen so far does not enter (a request is left undrafted only where no outcome
    of its drafts could repay the pass)."""
    assert saving_per_token(KController(k_max=4)) is None  # no plain step timed
    for accepted in (0, 4):
        cheap = timed_controller(draft_s=0.005, accepted=accepted)
        # k = 4: (4 x 5 ms + 130 ms) / 5 tokens = 30 ms a token against 100 ms
        assert saving_per_token(cheap) == pytest.approx(0.07)
    assert saving_per_token(cheap, batch_size=3) is None  # that batch was never timed
    dear = timed_controller(draft_s=0.2, accepted=4)  # drafts dearer than plain steps
    assert saving_per_token(dear) == 0.0
