"""The k controller's warm start: the target's step times measured before the first request."""

from __future__ import annotations

import pytest
import torch

from specserve.spec_decode import warm_start
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.replay import StepCosts, replay
from tests.conftest import make_tiny_model

# A CPU-like target: a verify of k + 1 tokens costs 1 + 0.15 k plain steps; a draft token 0.2.
VERIFY = tuple(1.0 + 0.15 * t for t in range(9))
COSTS = StepCosts(VERIFY, 0.0, 0.2)


def test_time_verify_steps_times_every_size_and_leaves_the_model_as_it_was() -> None:
    model = make_tiny_model("qwen2")
    before = {name: p.clone() for name, p in model.state_dict().items()}
    seconds = warm_start.time_verify_steps(model, 5, context=8)
    assert len(seconds) == 5
    assert all(s > 0 for s in seconds)
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


@pytest.mark.parametrize("kwargs", [{"num_sizes": 0}, {"context": 0}, {"repeats": 0}])
def test_time_verify_steps_rejects_empty_work(kwargs: dict[str, int]) -> None:
    args = {"num_sizes": 3, "context": 4, "repeats": 1, **kwargs}
    with pytest.raises(ValueError, match=">= 1"):
        warm_start.time_verify_steps(make_tiny_model(), **args)


def test_seeded_sizes_are_measured_and_explored() -> None:
    controller = KController(8)
    assert controller.explored_k() == 0 and not controller.plain_cost_measured()
    warm_start.seed(controller, VERIFY)
    assert controller.plain_cost_measured()
    assert controller.explored_k() == 8  # no climb through untimed sizes
    for size, seconds in enumerate(VERIFY, start=1):
        assert controller.verify_cost(size) == pytest.approx(seconds)


def test_the_first_live_timing_replaces_a_seed_and_later_ones_blend() -> None:
    """A seed timed while the machine was busy (a second server starting beside this one)
    must not linger: the first live step of its size replaces it; after that the running
    average works as for any measurement. Sizes not yet run keep their seeds."""
    controller = KController(4)
    warm_start.seed(controller, [2.0, 2.1, 2.2, 2.3, 2.4])
    controller.record_cost(0.0, 0, 1.0, 1)  # the first live plain step
    assert controller.verify_cost(1) == pytest.approx(1.0)
    controller.record_cost(0.0, 0, 2.0, 1)  # a later one blends in
    assert 1.0 < controller.verify_cost(1) < 2.0
    assert controller.verify_cost(3) == pytest.approx(2.2)


def test_a_fixed_k_controller_is_left_alone_and_bad_times_are_refused() -> None:
    fixed = KController(8, fixed_k=4)
    warm_start.seed(fixed, VERIFY)
    assert warm_start.warm(fixed, make_tiny_model()) == []
    assert not fixed.plain_cost_measured()
    with pytest.raises(ValueError, match="positive"):
        warm_start.seed(KController(2), [0.1, 0.0, 0.2])


def test_warm_times_the_controllers_sizes_and_seeds_them() -> None:
    controller = KController(3)
    seconds = warm_start.warm(controller, make_tiny_model("qwen2"))
    assert len(seconds) == 4
    assert controller.explored_k() == 3


def test_a_seeded_controller_drafts_long_from_its_first_step() -> None:
    """Every draft accepted: a cold controller decodes its first step plainly (nothing is
    timed) and climbs through untimed sizes (1, 3, 7); a seeded one drafts at its first step
    and reaches k_max sooner, so the same text takes less time."""
    runs = [8] * 40
    cold = replay(runs, KController(8), COSTS, "cold")
    controller = KController(8)
    warm_start.seed(controller, VERIFY)
    warm = replay(runs, controller, COSTS, "warm")
    assert cold.k_history[:3] == [0, 1, 3]
    assert warm.k_history[0] >= 2
    assert warm.k_history.index(8) < cold.k_history.index(8)
    assert warm.tpot_s < 0.98 * cold.tpot_s


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warm_start.SWITCH, raising=False)
    assert warm_start.enabled()
    monkeypatch.setenv(warm_start.SWITCH, "0")
    assert not warm_start.enabled()
