import pytest

from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.replay import StepCosts, common_prefix, replay

COSTS = StepCosts(verify_s=(0.2, 0.2, 0.21, 0.22, 0.23), draft_base_s=0.0, draft_token_s=0.02)


def test_plain_replay_is_one_step_per_token() -> None:
    res = replay([0, 3, 1, 0], 0, COSTS)
    assert res.num_steps == 4 and res.num_tokens == 4
    assert res.decode_s == pytest.approx(0.8)
    assert res.num_drafted == 0 and res.acceptance_rate == 0.0


@pytest.mark.parametrize(
    ("runs", "k", "steps", "drafted", "accepted"),
    [
        # 9 tokens after the first. k = 2 at positions 0 (run 4 -> +3), 3 (run 0 -> +1),
        # 4 (run 2 -> +3), 7 (budget: 1 draft left, run 5 -> +2).
        ([4, 4, 4, 0, 2, 2, 2, 5, 5], 2, 4, 7, 5),
        # Every draft right: k = 4 commits 5 per step, the last step is capped by the budget.
        ([8, 8, 8, 8, 8, 8, 8, 8], 4, 2, 6, 6),
        # Every draft wrong: one token per step, each paying for its drafts.
        ([0, 0, 0], 3, 3, 3, 0),
    ],
)
def test_fixed_k_follows_the_runs(
    runs: list[int], k: int, steps: int, drafted: int, accepted: int
) -> None:
    res = replay(runs, k, COSTS)
    assert res.num_tokens == len(runs)
    assert (res.num_steps, res.num_drafted, res.num_accepted) == (steps, drafted, accepted)
    expected_s = sum(COSTS.draft(kk) + COSTS.verify_s[kk] for kk in res.k_history)
    assert res.decode_s == pytest.approx(expected_s)


def test_controller_sees_observations_and_costs_and_is_released() -> None:
    ctl = KController(4)
    res = replay([6] * 30, ctl, COSTS, request_id="r")
    assert res.num_tokens == 30
    # All drafts right and drafting cheap: the controller ends up at k_max.
    assert res.k_history[-2] == 4
    assert ctl.verify_cost(5) == pytest.approx(0.23)  # the modelled cost it was fed
    assert "r" not in ctl._requests  # released at the end


def test_controller_backs_off_when_drafts_are_always_wrong() -> None:
    ctl = KController(4)
    res = replay([0] * 60, ctl, COSTS)
    assert res.k_history[-10:].count(0) >= 8


def test_drafting_after_plain_steps_pays_the_draft_catch_up() -> None:
    costs = StepCosts((0.2, 0.22, 0.24), 0.0, 0.02, catch_up_token_s=0.01)

    class Policy(KController):  # plain for 5 steps, then k = 1, then plain again
        def choose_k(self, request_id: str, batch_size: int = 1) -> int:
            self.calls = getattr(self, "calls", 0) + 1
            return 1 if self.calls == 6 else 0

    policy = Policy(2)
    res = replay([0] * 8, policy, costs)
    # The 6th step's draft lacks 6 committed tokens (the prefill's and 5 plain steps'): it
    # catches up 4 beyond the steady 2, and teaches the controller no draft cost.
    assert res.k_history == [0, 0, 0, 0, 0, 1, 0, 0]
    assert res.decode_s == pytest.approx(7 * 0.2 + 0.02 + 4 * 0.01 + 0.22)
    assert policy.costs.draft_per_token == {}
    assert costs.draft(2, behind=2) == pytest.approx(0.04)  # steady: nothing to catch up
    # Drafting every step: never behind by more than the steady catch-up (the last step,
    # capped at k = 0 by the budget, is plain).
    assert replay([0] * 8, 1, costs).decode_s == pytest.approx(7 * (0.02 + 0.22) + 0.2)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="k must be in"):
        replay([1, 1], 5, COSTS)
    with pytest.raises(ValueError, match=">= 0"):
        replay([1, -1], 1, COSTS)
    with pytest.raises(ValueError, match="positive"):
        StepCosts((), 0.0, 0.01)
    with pytest.raises(ValueError, match=">= 0"):
        StepCosts((0.1,), -1.0, 0.01)
    with pytest.raises(ValueError, match=">= 0"):
        StepCosts((0.1,), 0.0, 0.01, catch_up_token_s=-0.1)


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_confidence_stop_drafts_up_to_the_first_unsure_token() -> None:
    # Position 0: three confident tokens, then an unsure one: k = 4 drafts all four (the
    # unsure one included) and all are accepted (run 5).
    runs = [5, 0, 0, 0, 0, 0]
    conf = [[0.9, 0.9, 0.9, 0.2, 0.9], [0.1, 0.9], [0.9, 0.9], [0.9], [0.3], [0.9]]
    res = replay(runs, 4, COSTS, confidences=conf, threshold=0.5)
    # Step 1 at p=0: 4 drafts (stop at the 4th), 4 accepted -> +5, p=5 (last step: k = 0).
    assert res.k_history == [4, 0]
    assert (res.num_drafted, res.num_accepted, res.num_tokens) == (4, 4, 6)
    # An unsure first token: every step drafts one token and pays for one forward.
    res = replay([0, 0, 0, 0], 3, COSTS, confidences=[[0.1, 0.9, 0.9]] * 4, threshold=0.5)
    assert res.k_history == [1, 1, 1, 0] and res.decode_s == pytest.approx(
        3 * (COSTS.draft(1) + COSTS.verify_s[1]) + COSTS.verify_s[0]
    )
    with pytest.raises(ValueError, match="one confidence list per run"):
        replay([0, 0], 1, COSTS, confidences=[[0.5]], threshold=0.5)
