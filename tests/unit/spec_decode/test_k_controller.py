"""The k controller: expected tokens, cost model, k = 0 when speculation does not pay,
re-probing, fixed k, and convergence to the best k on a simulated workload."""

from __future__ import annotations

import random

import pytest

from specserve.spec_decode import k_controller
from specserve.spec_decode.k_controller import KController


def test_fixed_k() -> None:
    c = KController(8, fixed_k=5)
    assert c.choose_k("r") == 5
    c.observe("r", 5, 0)
    assert c.choose_k("r", batch_size=16) == 5
    with pytest.raises(ValueError):
        KController(4, fixed_k=5)
    with pytest.raises(ValueError):
        KController(-1)


def test_expected_tokens_from_priors_and_observations() -> None:
    c = KController(8, prior_acceptance=0.5, prior_weight=2.0)
    assert c.expected_tokens("new", 0) == 1.0
    assert c.expected_tokens("new", 2) == pytest.approx(1 + 0.5 + 0.25)
    for _ in range(200):
        c.observe("r", 4, 4)
    # Per-request estimate near 1 at every observed position.
    assert c.expected_tokens("r", 4) == pytest.approx(5.0, abs=0.2)
    # Another request borrows the global estimate as its prior.
    assert c.expected_tokens("other", 4) > c.expected_tokens("new-controller-would-have", 0)
    with pytest.raises(ValueError):
        c.observe("r", 2, 3)


def test_speculation_off_when_it_does_not_pay_and_reprobe() -> None:
    c = KController(8, probe_interval=5)
    c.record_cost(0.0, 0, 0.2, 1)  # plain step: 200 ms
    c.record_cost(0.4, 4, 0.22, 5)  # draft 100 ms per token, verify of 5 tokens 220 ms
    for _ in range(50):
        c.observe("r", 4, 0)  # nothing ever accepted
    ks = [c.choose_k("r") for _ in range(11)]
    assert ks[0] == 1  # the start probe: one draft at the request's first step
    assert ks[1:].count(0) == 8 and ks[5] == ks[10] == 2  # plain, a probe every 5th step
    # The text turns repetitive: probes succeed and speculation comes back.
    for _ in range(40):
        c.observe("r", 2, 2)
    assert c.choose_k("r") > 0


def test_cheap_accurate_drafts_use_large_k() -> None:
    c = KController(8)
    c.record_cost(0.0, 0, 0.2, 1)
    c.record_cost(0.001, 8, 0.24, 9)  # an n-gram-like proposer: drafting is free
    for _ in range(30):
        c.observe("r", 8, 8)
    assert c.choose_k("r") == 8


def test_verify_cost_is_kept_per_step_size() -> None:
    c = KController(8)
    assert c.verify_cost(1) == 1.0 and c.verify_cost(3) == pytest.approx(1.04)
    c.record_cost(0.0, 0, 0.2, 1, batch_size=1)  # 1 token
    c.record_cost(0.0, 0, 0.5, 1, batch_size=8)  # 8 tokens
    assert c.verify_cost(1, 1) == 0.2 and c.verify_cost(1, 8) == 0.5
    assert c.verify_cost(5, 1) == pytest.approx(0.2 + 0.3 * 4 / 7)  # interpolated
    # 32 tokens: past the largest measured size, along the slope of the two measured ones
    assert c.verify_cost(4, 8) == pytest.approx(0.5 + 0.3 / 7 * 24)
    # A large batch where verifying drafts is expensive: speculation is switched off there,
    # while the same acceptance still pays at batch 1.
    c.record_cost(0.0, 0, 1.4, 4, batch_size=8)  # 32 tokens cost 1.4 s
    c.record_cost(0.02, 1, 0.21, 2, batch_size=1)
    for i in range(40):
        c.observe("r", 1, i % 2)  # half the drafts accepted
    assert c.best_k("r", batch_size=8) == 0
    assert c.best_k("r", batch_size=1) > 0


def test_a_step_is_costed_by_the_tokens_its_forward_ran() -> None:
    """A batch of 4 where one request verified 5 drafts and three none: without padding the
    forward ran 9 tokens, and its time is kept as a 9-token step's; without the size, as the
    padded 4 x 6 = 24."""
    c = KController(8)
    c.record_cost(0.05, 5, 0.27, 6, batch_size=4, num_step_tokens=9)
    assert c.costs.measured_by_size() == {9: 0.27}
    padded = KController(8)
    padded.record_cost(0.05, 5, 0.58, 6, batch_size=4)
    assert padded.costs.measured_by_size() == {24: 0.58}


def simulate(c: KController | None, k_fixed: int, accept: list[float], steps: int = 400) -> float:
    """Tokens per second of a request with per-position acceptance ``accept`` on a model
    whose step costs draft 50 ms/token and verify 200 ms (+2 % per token)."""
    rng = random.Random(0)
    tokens, seconds = 0, 0.0
    for _ in range(steps):
        k = c.choose_k("r") if c is not None else k_fixed
        n = 0
        while n < k and rng.random() < accept[min(n, len(accept) - 1)]:
            n += 1
        draft_s, verify_s = 0.05 * k, 0.2 * (1 + 0.02 * k)
        if c is not None:
            c.observe("r", k, n)
            c.record_cost(draft_s, k, verify_s, k + 1)
        tokens += n + 1
        seconds += draft_s + verify_s
    return tokens / seconds


@pytest.mark.parametrize(
    "accept", [[0.95], [0.9, 0.8, 0.7, 0.6], [0.6, 0.4], [0.1], [0.0]], ids=str
)
def test_adaptive_is_close_to_the_best_fixed_k(accept: list[float]) -> None:
    best = max(simulate(None, k, accept) for k in range(9))
    adaptive = simulate(KController(8), 0, accept)
    assert adaptive >= 0.93 * best, (adaptive, best)
    assert adaptive >= 0.95 * simulate(None, 0, accept)  # never much worse than plain


def test_deep_positions_follow_the_request_not_earlier_requests() -> None:
    """A prose request after many all-accepted (structured) requests: positions it rarely
    reaches lean on its own shallow positions, not on the others' long runs."""
    c = KController(8)
    for i in range(40):
        c.observe(f"structured-{i}", 8, 8)
    for _ in range(6):
        c.observe("prose", 4, 0)  # rejected at the first position every time
    est = c.acceptance_estimates("prose", 4)
    assert est[0] < 0.5
    assert all(a < 0.75 for a in est[1:]), est  # the pooled estimate would be ~0.97
    # A new request still starts from the recent global estimate.
    assert c.acceptance_estimates("fresh", 1)[0] > 0.8


def test_global_estimate_forgets_old_requests() -> None:
    forgetting, pooling = KController(8, global_decay=0.9), KController(8, global_decay=1.0)
    for c in (forgetting, pooling):
        for _ in range(50):
            c.observe("a", 4, 4)
        for _ in range(50):
            c.observe("b", 4, 0)
    assert forgetting.acceptance_estimates("fresh", 1)[0] < 0.2  # mostly the prior left
    assert pooling.acceptance_estimates("fresh", 1)[0] == pytest.approx(0.5, abs=0.02)
    with pytest.raises(ValueError, match="global_decay"):
        KController(8, global_decay=0.0)


def test_verify_cost_never_decreases_with_step_size() -> None:
    """A noisy timing of a 3-token forward below the 1-token one must not make drafting look
    cheaper than plain decoding."""
    c = KController(8)
    c.record_cost(0.0, 0, 0.24, 1)
    c.record_cost(0.01, 2, 0.20, 3)  # n-gram-like: drafting costs 5 ms per token
    c.record_cost(0.02, 4, 0.25, 5)
    assert c.verify_cost(3) == pytest.approx(0.24)
    assert c.verify_cost(2) == pytest.approx(0.24)
    assert c.verify_cost(5) == pytest.approx(0.25)
    for _ in range(30):
        c.observe("r", 2, 0)  # cheap drafts that are always wrong
    assert c.best_k("r") == 0  # with the raw 0.20 s, k = 2 would look 19 % faster


def test_unmeasured_large_steps_follow_the_measured_slope() -> None:
    """A compute-bound CPU: 1 token 100 ms, 5 tokens 200 ms. A 9-token verify is estimated
    along that slope (300 ms), not by the memory-bound prior (+2 % per token: ~215 ms), so
    a deep draft is not chosen on a wrong cost; with one measured size the prior still
    scales it."""
    c = KController(8)
    c.record_cost(0.0, 0, 0.1, 1)
    assert c.verify_cost(9) == pytest.approx(0.1 * 1.16)  # one size measured: prior scaling
    c.record_cost(0.0, 4, 0.2, 5)
    assert c.verify_cost(9) == pytest.approx(0.3)
    assert c.verify_cost(3) == pytest.approx(0.15)  # between measured sizes: interpolated
    # A flat measured slope (9 tokens as dear as 5: the cost never decreases with size) does
    # not make larger steps look free: the prior's scaling is the floor.
    c.record_cost(0.0, 0, 0.1, 1, batch_size=9)
    assert c.verify_cost(9) == pytest.approx(0.2)
    assert c.verify_cost(16) == pytest.approx(0.2 * _prior(16) / _prior(9))


def _prior(tokens: int) -> float:
    return 1.0 + 0.02 * (tokens - 1)


def _decode_rejected_drafts(c: KController, tokens: int) -> float:
    """Decode ``tokens`` tokens whose drafts are never accepted, timing every step as a CPU
    verify does (+12 % per extra token); returns the speed relative to plain decoding."""
    seconds, done = 0.0, 0
    while done < tokens:
        k = c.choose_k("prose")
        cost = 0.17 * (1.0 + 0.12 * k)
        if k:
            c.observe("prose", k, 0)
        c.record_cost(0.0, k, cost, k + 1)  # a free proposer (n-gram), as the engine: last
        seconds += cost
        done += 1
    return tokens * 0.17 / seconds


def test_plain_cost_is_measured_before_drafting() -> None:
    c = KController(8)
    assert not c.plain_cost_measured() and c.choose_k("r") == 0  # plain first: the yardstick
    c.record_cost(0.0, 0, 0.2, 1)
    assert c.plain_cost_measured() and c.choose_k("r") > 0  # the prior acceptance pays now
    assert c.choose_k("r", batch_size=3) == 0  # a batch size with no plain step timed yet
    c.record_cost(0.0, 0, 0.3, 1, batch_size=3)
    assert c.choose_k("r", batch_size=3) > 0


def test_rejected_drafts_fall_back_to_plain_when_multi_token_steps_cost_more() -> None:
    # Drafting from the first step timed only 2..9-token steps; the plain cost, scaled down
    # from them by the prior slope, made k = 1 look nearly free, and the controller verified
    # rejected k = 1 drafts to the end (0.92x of plain over 48 tokens here). Timing plain
    # first gave 0.97x; exploring step sizes before trusting them and backing probes off, 0.98x.
    # The drafting margin (test_a_drafting_request_keeps_drafting_on_a_near_tie) drafts a step
    # or two longer here before turning plain: 0.983x -> 0.978x over 48 tokens, 0.995x over 400.
    assert _decode_rejected_drafts(KController(8), 48) >= 0.975
    assert _decode_rejected_drafts(KController(8), 400) >= 0.99


def test_step_sizes_are_explored_before_they_are_trusted() -> None:
    """A fresh controller does not jump to a 9-token verify on the prior's guess of its cost:
    each drafting step is at most twice the largest step timed so far."""
    c = KController(8)
    c.record_cost(0.0, 0, 0.2, 1)
    assert c.explored_k() == 1 and c.choose_k("r") == 1  # the prior alone would pick 8
    c.record_cost(0.0, 1, 0.21, 2)
    assert c.choose_k("r") == 3
    c.record_cost(0.0, 3, 0.22, 4)
    assert c.choose_k("r") == 7
    c.record_cost(0.0, 7, 0.23, 8)
    assert c.choose_k("r") == 8
    # Per batch size: 4 requests x 3 tokens is within twice the 8 tokens timed, 4 x 5 is not.
    c.record_cost(0.0, 0, 0.3, 1, batch_size=4)
    assert c.explored_k(batch_size=4) == 3 and c.choose_k("r", batch_size=4) <= 3


def _probe_gaps(c: KController, num_probes: int, accepted: int | None = None) -> list[int]:
    """Plain steps before each of the next ``num_probes`` steps with k > 0, each of which
    gets ``accepted`` drafts accepted (None: all) and takes what the cost model says."""
    out, plain = [], 0
    while len(out) < num_probes:
        k = c.choose_k("r")
        if k == 0:
            plain += 1
            continue
        out.append(plain)
        plain = 0
        c.observe("r", k, k if accepted is None else accepted)
        c.record_cost(c.draft_cost(k), k, c.verify_cost(k + 1), k + 1)
    return out


def test_probe_interval_backs_off_after_rejected_probes() -> None:
    c = KController(8, probe_interval=4, max_probe_backoff=4)
    c.record_cost(0.0, 0, 0.2, 1)
    c.record_cost(0.0, 2, 0.3, 3)  # drafting is dear ...
    for _ in range(20):
        c.observe("r", 2, 0)  # ... and never right
    # Plain steps before each probe: the start probe at the first step, then doubling after
    # each rejected probe, up to 4 x 4.
    assert _probe_gaps(c, 4, 0) == [0, 7, 15, 15]
    # The text turns repetitive: accepted probes, still backed off while k = 0 stays best
    # (each probe's run is that one step), until drafting pays again.
    assert _probe_gaps(c, 3, 2) == [15, 15, 15]
    k = c.choose_k("r")  # the third probe's run goes on ...
    assert k > 0
    c.observe("r", k, k)
    c.record_cost(c.draft_cost(k), k, c.verify_cost(k + 1), k + 1)
    for _ in range(40):  # ... until rejected drafts turn drafting off again
        c.observe("r", 2, 0)
    assert _probe_gaps(c, 1, 0) == [3]  # it beat plain decoding: the interval was reset
    with pytest.raises(ValueError, match="max_probe_backoff"):
        KController(8, max_probe_backoff=0)


def test_accepted_probes_back_off_where_drafting_does_not_pay() -> None:
    # Multi-token steps compute bound: a 3-token verify costs 3 plain steps and drafting as
    # much again, so even drafts that are always accepted do not pay. Each probe's drafts are
    # accepted, yet k = 0 stays the best choice, so the probes back off as rejected ones do.
    c = KController(8, probe_interval=4, max_probe_backoff=4)
    c.record_cost(0.0, 0, 0.2, 1)
    c.record_cost(0.6, 2, 0.6, 3)
    assert _probe_gaps(c, 4) == [0, 7, 15, 15]


def test_requests_start_with_a_probe_and_the_backoff_the_last_probe_left() -> None:
    # Drafting pays only when drafts are accepted: 30 ms a draft token, a 3-token verify 10 %
    # dearer than a plain step (a rejected start probe then loses by more than EARLY_MARGIN).
    c = KController(8, probe_interval=4, max_probe_backoff=8)
    c.record_cost(0.0, 0, 0.2, 1)
    c.record_cost(0.06, 2, 0.22, 3)
    for _ in range(20):
        c.observe("r", 2, 0)
    assert _probe_gaps(c, 4, 0) == [0, 7, 15, 31]  # prose: every probe rejected
    c.release("r")
    # The next request still gets its start probe, then the backoff prose left (8 x 4).
    assert _probe_gaps(c, 2, 0) == [0, 31]
    c.release("r")
    # A structured request: its start probe's draft is accepted and drafting pays.
    assert c.choose_k("s") == 1
    c.observe("s", 1, 1)
    c.record_cost(0.02, 1, 0.21, 2)
    for _ in range(4):
        k = c.choose_k("s")
        assert k > 0
        c.observe("s", k, k)
        c.record_cost(c.draft_cost(k), k, c.verify_cost(k + 1), k + 1)
    c.release("s")
    # Its drafting run reset the shared factor: the next prose request backs off from 1 again.
    for _ in range(20):
        c.observe("r", 2, 0)
    assert _probe_gaps(c, 2, 0) == [0, 7]


@pytest.mark.parametrize(("catch_up_s", "gaps"), [(0.0, [0, 3, 3, 3, 3]), (0.6, [0, 3, 3, 7, 15])])
def test_probe_runs_are_judged_by_their_measured_time_catch_up_included(
    catch_up_s: float, gaps: list[int]
) -> None:
    # Cheap drafts (20 ms a token, a 3-token verify 10 % dearer than a plain step) on a text
    # where each drafting run's first two steps are accepted and the rest rejected: the runs
    # beat plain decoding, and the probes come every 4 plain steps. If a draft model first
    # catches up over the plain steps since its last draft (0.6 s, three plain steps), a
    # probe's run loses, and the probes back off although their drafts were accepted (from the
    # second probe: the start's run, kept drafting on near ties by the drafting margin, is long
    # enough to pay for one catch-up).
    c = KController(8, probe_interval=4, max_probe_backoff=8)
    c.record_cost(0.0, 0, 0.2, 1)
    c.record_cost(0.04, 2, 0.22, 3)
    for _ in range(6):
        c.observe("r", 2, 0)
    out, plain, in_run = [], 0, 0
    while len(out) < len(gaps):
        k = c.choose_k("r")
        if k == 0:
            plain, in_run = plain + 1, 0
            continue
        if not in_run:
            out.append(plain)
        c.observe("r", k, k if in_run < 2 else 0)
        step_s = c.draft_cost(k) + c.verify_cost(k + 1)
        if not in_run and plain:
            step_s += catch_up_s
        c.record_cost(c.draft_cost(k), k, c.verify_cost(k + 1), k + 1, step_s=step_s)
        plain, in_run = 0, in_run + 1
    assert out == gaps


def test_early_stops_are_learnt_and_priced() -> None:
    """A proposer asked for 6 that always returns 2: the controller learns c_1 = 1, c_2 = 0,
    so asking for 6 is priced as the 2 drafts and 3-token verify it gets."""
    c = KController(8)
    c.record_cost(0.0, 0, 0.2, 1)
    c.record_cost(0.02, 1, 0.21, 2)
    c.record_cost(0.04, 2, 0.22, 3)
    c.record_cost(0.12, 6, 0.3, 7)
    full = c.step_cost("r", 6)
    assert full == pytest.approx(0.02 * 6 + 0.3)  # nothing stopped early yet: d = k
    for _ in range(100):
        c.observe("r", 2, 1, num_asked=6)
    conts = c.continuation_estimates("r", 6)
    assert conts[0] == pytest.approx(1.0) and conts[1] < 0.05
    lengths = c.draft_length_distribution("r", 6)
    assert lengths[1] > 0.95 and sum(lengths) == pytest.approx(1.0)
    assert c.step_cost("r", 6) == pytest.approx(0.02 * 2 + 0.22, rel=0.05)
    # Expected tokens count only drafts that are made: about those of k = 2.
    assert c.expected_tokens("r", 6) == pytest.approx(c.expected_tokens("r", 2), rel=0.05)
    # A request whose proposer never stops early learns d = k (from the pooled estimate).
    assert c.draft_length_distribution("s", 3)[1] > 0.9
    for _ in range(20):
        c.observe("s", 3, 3)
    assert c.draft_length_distribution("s", 3)[-1] > 0.8
    with pytest.raises(ValueError, match="num_asked"):
        c.observe("r", 3, 1, num_asked=2)


def simulate_stopping_draft(c: KController | None, k_fixed: int, steps: int = 400) -> float:
    """Tokens per second with a draft that stops itself: each draft token is confident with
    probability 0.7 (then accepted with 0.95) or unsure (accepted with 0.3, and the draft
    stops after it); draft 30 ms/token, verify 200 ms (+5 % per token)."""
    rng = random.Random(1)
    tokens, seconds = 0, 0.0
    for _ in range(steps):
        k = c.choose_k("r") if c is not None else k_fixed
        drafted, accepted, alive = 0, 0, True
        while drafted < k:
            drafted += 1
            confident = rng.random() < 0.7
            if alive and rng.random() < (0.95 if confident else 0.3):
                accepted += 1
            else:
                alive = False
            if not confident:
                break
        draft_s, verify_s = 0.03 * drafted, 0.2 * (1 + 0.05 * drafted)
        if c is not None:
            c.observe("r", drafted, accepted, num_asked=k)
            c.record_cost(draft_s, drafted, verify_s, drafted + 1)
        tokens += accepted + 1
        seconds += draft_s + verify_s
    return tokens / seconds


def test_a_draft_that_stops_itself_is_modelled_and_asked_for_long_drafts() -> None:
    best_fixed = max(simulate_stopping_draft(None, k) for k in range(9))
    # With the stop, asking for the most is as good as the best fixed k (within noise).
    assert simulate_stopping_draft(None, 8) >= 0.97 * best_fixed
    model = KController(8, confidence_stop=True)
    rate = simulate_stopping_draft(model, 0)
    assert rate >= 0.95 * best_fixed, (rate, best_fixed)
    assert min(model.choose_k("r") for _ in range(5)) >= 6
    q, a_c, a_u = model.confidence_estimates("r")  # truth: 0.7, 0.95, 0.3
    assert 0.5 < q < 0.8 and a_c > 0.9 and a_u < 0.5
    # Per-position averages cannot see that a running draft is a confident one: they stop
    # short and lose.
    per_position = KController(8)
    assert simulate_stopping_draft(per_position, 0) < 0.93 * rate
    # When drafting does not pay, it still chooses plain steps.
    c = KController(8, confidence_stop=True)
    c.record_cost(0.0, 0, 0.2, 1)
    c.record_cost(0.4, 4, 0.3, 5)
    for _ in range(50):
        c.observe("r", 1, 0, num_asked=8)
    assert c.best_k("r") == 0


def test_confidence_counts_classify_tokens_from_draft_lengths() -> None:
    from specserve.spec_decode.decayed_counts import ConfidenceCounts

    counts = ConfidenceCounts()
    # Asked 8, drafted 3: the stop ended it, so tokens 1-2 were confident, token 3 unsure;
    # 2 accepted: both confident ones accepted, the unsure one rejected.
    counts.observe(8, 3, 2, decay=1.0)
    assert (counts.known, counts.confident) == (3.0, 2.0)
    assert counts.seen == {True: 2.0, False: 1.0} and counts.accepted == {True: 2.0, False: 0.0}
    # Asked 4, drafted 4: token 4's class is unknown; 1 accepted: verdicts of tokens 1-2 seen.
    counts.observe(4, 4, 1, decay=1.0)
    assert (counts.known, counts.confident) == (6.0, 5.0)
    assert counts.seen == {True: 4.0, False: 1.0} and counts.accepted == {True: 3.0, False: 0.0}
    assert counts.confident_rate(0.5, 0.0) == pytest.approx(5 / 6)
    assert counts.acceptance(False, 0.4, 1.0) == pytest.approx(0.4 / 2)


def test_a_reach_probe_frees_k_from_a_stale_slow_timing() -> None:
    """A draft that stops after 2 tokens while the estimates are young, and one 3-token
    verify timed 40 % slow (a busy machine), leave sizes above 3 untimed and the slope of the
    two largest timed ones steep: k settles at 1, and without another look never leaves it,
    since only a 3-token step would time that size again. Once the drafts run to full length,
    the next reach probe asks for 2k + 1 = 3 drafts, its step times 4 tokens, and k climbs to
    the largest."""
    costs = {1: 0.177, 2: 0.230, 3: 0.262 * 1.4, 4: 0.290, 5: 0.300, 6: 0.320, 7: 0.335,
             8: 0.345, 9: 0.351}  # fmt: skip  # seconds per verify size, AVX2-like
    c = KController(k_max=8, confidence_stop=True, probe_interval=16)
    ks = []
    for step in range(60):
        k = c.choose_k("r")
        drafted = min(k, 2) if step < 5 else k  # early drafts stop after 2 tokens
        c.record_cost(0.02 * drafted, k, costs[drafted + 1], drafted + 1)
        c.observe("r", drafted, drafted, k)
        ks.append(k)
    assert ks[4:16] == [1] * 12  # stuck: sizes above 3 untimed, k = 1 looks best
    assert max(ks[16:]) == 8 and ks[-1] >= 5


def _after_a_rejected_start(slower: float) -> tuple[KController, float, float]:
    """A fresh request whose first draft (one token, the prior's acceptance pays for it) was
    rejected, then a 2-token step priced so that drafting one token is ``slower`` (0.01: 1 %)
    slower than plain decoding; the controller, the rate of plain decoding and the best rate
    of a k > 0."""
    c = KController(8, probe_interval=100)
    c.record_cost(0.0, 0, 0.2, 1)
    assert c.choose_k("r") == 1  # the prior's acceptance pays: the request drafts
    c.observe("r", 1, 0)  # and its first draft is rejected
    c.record_cost(0.0, 1, 0.2 * c.expected_tokens("r", 1) / (1 - slower), 2)
    best = max(c.rate("r", k) for k in range(1, c.explored_k() + 1))
    return c, c.rate("r", 0), best


def test_a_drafting_request_keeps_drafting_on_a_near_tie(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that drafted at its last step turns plain only if plain decoding beats its
    best k > 0 by more than DRAFTING_MARGIN: plain steps teach the estimates nothing, and a
    near tie after one rejected draft (an answer's opening words) left a request plain for
    probe_interval steps where drafting paid (seen live on the AVX2 host)."""

    def after_a_rejected_start(margin: float) -> tuple[KController, int]:
        monkeypatch.setattr(k_controller, "DRAFTING_MARGIN", margin)
        c, plain, best = _after_a_rejected_start(0.01)
        assert 0.97 * plain < best < plain
        return c, c.choose_k("r")

    c, k = after_a_rejected_start(k_controller.DRAFTING_MARGIN)
    assert k > 0  # within the margin: it drafts on, and the next verify updates its estimates
    for _ in range(6):  # drafts keep being rejected: the estimates fall below the margin
        c.observe("r", k, 0)
        c.record_cost(0.0, k, c.verify_cost(k + 1), k + 1)
        k = c.choose_k("r")
    assert k == 0
    monkeypatch.setattr(k_controller, "EARLY_MARGIN", 0.0)
    assert after_a_rejected_start(0.0)[1] == 0  # without the margins: plain at once


def test_a_request_stops_drafting_in_its_first_steps_only_on_a_clear_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within a request's first EARLY_STEPS drafting steps plain decoding must win by
    EARLY_MARGIN (10 %), not DRAFTING_MARGIN (3 %), for it to stop drafting: one rejected
    opening draft had stopped requests whose later drafts ran 8 tokens (replayed traces of a
    host whose multi-token verify was dear). Past those steps the 3 % margin decides."""

    def after_a_rejected_start(early_steps: int) -> int:
        monkeypatch.setattr(k_controller, "EARLY_STEPS", early_steps)
        c, plain, best = _after_a_rejected_start(0.05)  # between the two margins
        assert (
            plain / (1 + k_controller.EARLY_MARGIN)
            < best
            < plain / (1 + k_controller.DRAFTING_MARGIN)
        )
        return c.choose_k("r")

    assert k_controller.EARLY_STEPS > 1
    assert after_a_rejected_start(k_controller.EARLY_STEPS) > 0  # its first step: drafts on
    assert after_a_rejected_start(1) == 0  # past its early steps: plain
