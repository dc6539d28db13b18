"""Choosing k (draft tokens per step) per request to maximise expected tokens per second.

Terms:
    conditional acceptance a_i: probability that draft position i is accepted given that
        positions < i were. Estimated per request from decayed counts. a_0 is shrunk
        towards the estimate over recent steps of all requests (itself shrunk towards
        ``prior_acceptance``); a_i for i > 0 is shrunk towards the request's own a_{i-1}
        estimate. Deep positions are reached rarely, so their estimates lean on the prior;
        taking it from the request's shallower positions rather than from other requests
        keeps a request with short accepted runs (prose) from inheriting the long runs of
        earlier structured requests (a pooled prior made the controller pick k = 4-5 on
        prose where k = 3 was best). Replays of recorded traces
        (``benchmarks/k_replay.py``) chose this estimator and the defaults.
    continuation c_j (j >= 1): probability that a proposer asked for more than j drafts
        returns more than j, given that it returned j: a draft model that stops after an
        unsure token (its confidence stop) or an n-gram match that runs out returns fewer
        drafts than asked. Estimated like a_i (decayed counts, shrunk towards the counts of
        all requests, those towards 1: a proposer that never stops early). The number of
        drafts a step asking for k returns, d, has P(d >= j + 1) = prod_{i=1..j} c_i.
    expected tokens E(k) = 1 + sum_{j=1..k} P(d >= j) prod_{i<j} a_i: accepted drafts plus
        the recovered/bonus token of one verify step.
    step cost C(k) = draft_cost(E[d]) + E[verify_cost(d + 1)]: measured wall times (with no
        early stops, d = k: draft_cost(k) + verify_cost(k + 1)). Asking for more drafts than
        a stop lets through costs nothing, so with a confidence stop the best k is often
        k_max and the stop sets each step's length from the draft's own confidence. The
        draft cost is a time per draft forward, per batch size (the engine passes it); the
        verify cost is kept per step size, the tokens the forward ran (batch_size * (k + 1)
        if all draft k), so a large batch, where extra verify tokens make the forward compute
        bound, sees its real cost; a choice prices its step as if all drafted its k. Unmeasured
        sizes are interpolated between measured ones; past the largest measured size,
        extrapolated along the slope of the two largest (at least the prior's scaling);
        otherwise scaled by a mild prior slope (a k + 1 token forward costs about what a 1
        token forward does when memory bound).
    rate(k) = E(k) / C(k); rate(0) = 1 / verify_cost(1) is plain decoding.

A draft model with a confidence stop (``confidence_stop``) ends a draft after its first
token drafted with a low top probability. Its draft length then says how sure the draft is:
the tokens before the last are confident ones, accepted far more often than unsure ones,
which per-position averages cannot see (with them the controller kept drafts short where
asking for more and letting the stop cut them was faster). So the controller models the
draft instead: each token is confident with probability q, accepted with a_c if confident and
a_u if not, the draft continues while its tokens are confident. Then P(d = j) = q^(j-1) (1 - q)
for j < k (q^(k-1) for j = k) and P(first j accepted) = (q a_c)^(j-1) (q a_c + (1 - q) a_u);
q, a_c, a_u are decayed counts per request shrunk towards those of all requests, and those
towards priors (0.8, 0.8, 0.4). k is still the argmax of E(k) / C(k), so a target whose
multi-token verify is dear keeps short drafts. Replays of recorded traces
(``benchmarks/k_replay.py --thresholds``) chose this over the per-position model with the
same stop, and over always asking for the largest explored k.

k = 0 is chosen when no k > 0 is expected to beat plain decoding; a request that drafted at its
last step turns plain only if plain wins by ``DRAFTING_MARGIN`` (3 %), by ``EARLY_MARGIN`` (10 %)
in its first ``EARLY_STEPS`` (4) drafting steps: plain steps teach the estimates nothing, and a
rejected first draft (an answer's opening words) had cost ``probe_interval`` plain steps on a
near tie, and stopped requests whose later drafts ran 8 tokens (replays of a slow-verify
host's traces). A request whose first decode step would be plain drafts one token there (a
*start probe*: its draft model ran the prompt during the prefill, so this costs a draft forward
and a 2-token verify): each request gets its own look. Then every ``probe_interval`` plain
steps times the request's backoff factor it probes with a small k so that its estimates can
recover. Probes after plain steps are dear: a draft model first catches up over every token
since its last draft (5-7 ms a token for the 0.5B draft on the AVX2 host, 12-14 % of a plain
1.5B step), so a longer interval alone does not make them cheaper per token.

The backoff factor follows each probe's *run* (``drafting_runs.py`` says how): reset after
any accepted draft, the interval had put the adaptive arm 6-17 % below plain (AMX host).

Step sizes are explored before they are trusted: k is capped so that a step is at most twice
the largest size already timed (a request's k + 1 tokens times the batch size); the prior's
+2 % a token had made a 9-token verify look almost free on a CPU (10-20 % a token). The cap
reaches k = 8 within three drafting steps when drafts are accepted.

Every ``probe_interval`` steps with k > 0 a request asks once for 2k + 1 drafts (within the
explored k: a reach probe), so sizes above its choice are timed again: one slow timing (a busy
machine, an early stop) otherwise kept a larger k looking dear and untimed, drafting 1-3 tokens
where 6 are accepted (``test_a_reach_probe_frees_k_from_a_stale_slow_timing``).

Plain decoding is the yardstick: ``choose_k`` returns 0 while no step of ``batch_size`` tokens
was timed (a plain cost scaled down from a multi-token step had made k = 1 look nearly free on
a CPU: ``test_rejected_drafts_fall_back_to_plain_when_multi_token_steps_cost_more``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specserve.spec_decode import verify_costs
from specserve.spec_decode.decayed_counts import ConfidenceCounts, PrefixCounts
from specserve.spec_decode.drafting_runs import DraftingRuns, ProbeState

DRAFTING_MARGIN = 0.03  # what k = 0 must gain over drafting for a drafting request to stop
EARLY_MARGIN, EARLY_STEPS = 0.10, 4  # the margin over a request's first drafting steps
# Priors of the confidence-stop model (q, a_c, a_u in the module docstring).
_PRIOR_CONFIDENT, _PRIOR_ACCEPT_CONFIDENT, _PRIOR_ACCEPT_UNSURE = 0.8, 0.8, 0.4


@dataclass
class _RequestState:
    probe: ProbeState
    acceptance: PrefixCounts = field(default_factory=PrefixCounts)  # a_i
    continuation: PrefixCounts = field(default_factory=PrefixCounts)  # c_j at index j - 1
    confidence: ConfidenceCounts = field(default_factory=ConfidenceCounts)
    drafted: int = 0  # steps that drafted


class KController:
    """Per-request k in [0, k_max] (see the module docstring); ``fixed_k`` disables adaptation.

    Args:
        k_max: largest k ever chosen.
        fixed_k: always choose this k (still capped by k_max).
        prior_acceptance: a_i assumed before anything is observed.
        prior_weight: pseudo-observations behind each prior.
        decay: per-observation decay of a request's counts (recent steps weigh more).
        global_decay: per-observation decay of the counts over all requests.
        probe_interval: plain steps after which a request tries speculation again.
        max_probe_backoff: largest factor of the probe interval (after probes that failed).
        draft_cost_prior: draft time per token relative to a 1-token verify, until measured.
        ema: weight of a new cost measurement in the running averages.
        confidence_stop: the proposer ends each draft after its first unsure token (a draft
            model's confidence stop): expected tokens and draft lengths follow the
            confident/unsure model of the module docstring.

    Attributes:
        draft_cost_scale: per request, the share of the measured draft cost its next draft
            is expected to pay (None: all of it); a hybrid proposer's ``draft_cost_scale``,
            linked by the loop that runs both (``link_proposer``): its suffix drafts cost
            nothing, and costed as the draft model's they kept k at 2-3 on a structured
            prompt where the suffix's drafts were accepted whole.
    """

    def __init__(
        self,
        k_max: int,
        fixed_k: int | None = None,
        prior_acceptance: float = 0.7,
        prior_weight: float = 3.0,
        decay: float = 0.9,
        global_decay: float = 0.98,
        probe_interval: int = 16,
        max_probe_backoff: int = 8,
        draft_cost_prior: float = 0.1,
        ema: float = 0.2,
        confidence_stop: bool = False,
    ) -> None:
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        if fixed_k is not None and not (0 <= fixed_k <= k_max):
            raise ValueError(f"fixed_k must be in [0, k_max={k_max}], got {fixed_k}")
        if not (0.0 < prior_acceptance < 1.0):
            raise ValueError(f"prior_acceptance must be in (0, 1), got {prior_acceptance}")
        if not all(0.0 < v <= 1.0 for v in (decay, global_decay, ema)):
            raise ValueError(
                f"decay, global_decay and ema must be in (0, 1], got {decay}, {global_decay}, {ema}"
            )
        if probe_interval < 1:
            raise ValueError(f"probe_interval must be >= 1, got {probe_interval}")
        if max_probe_backoff < 1:
            raise ValueError(f"max_probe_backoff must be >= 1, got {max_probe_backoff}")
        self.k_max = k_max
        self.fixed_k = fixed_k
        self.prior_acceptance = prior_acceptance
        self.prior_weight = prior_weight
        self.decay = decay
        self.global_decay = global_decay
        self.probe_interval = probe_interval
        self.max_probe_backoff = max_probe_backoff
        self.confidence_stop = confidence_stop
        self._global = PrefixCounts()
        self._global_continuation = PrefixCounts()
        self._global_confidence = ConfidenceCounts()
        self._requests: dict[str, _RequestState] = {}
        self.runs = DraftingRuns(
            lambda batch: self.verify_cost(1, batch), max_probe_backoff, probe_interval
        )
        self.costs = verify_costs.MeasuredCosts(ema, draft_cost_prior)
        self.draft_cost_scale: Callable[[str], float] | None = None

    def link_proposer(self, proposer: object) -> None:
        """Take ``proposer``'s ``draft_cost_scale`` where it has one."""
        self.draft_cost_scale = getattr(proposer, "draft_cost_scale", None)

    # ---- observations ---------------------------------------------------------------------

    def observe(
        self, request_id: str, num_drafted: int, num_accepted: int, num_asked: int | None = None
    ) -> None:
        """One verify step of a request: ``num_accepted`` of ``num_drafted`` drafts kept, of
        ``num_asked`` asked for (None: as many as drafted)."""
        if num_asked is None:
            num_asked = num_drafted
        if not (0 <= num_accepted <= num_drafted <= num_asked):
            raise ValueError(
                "need 0 <= num_accepted <= num_drafted <= num_asked, got "
                f"{num_accepted}, {num_drafted}, {num_asked}"
            )
        if num_drafted == 0:
            return
        state = self._state(request_id)
        state.drafted += 1
        self.runs.observed(request_id, state.probe, num_accepted + 1)
        if self.confidence_stop:  # the confident/unsure model replaces a_i and c_j
            state.confidence.observe(num_asked, num_drafted, num_accepted, self.decay)
            self._global_confidence.observe(num_asked, num_drafted, num_accepted, self.global_decay)
            return
        reached, conts = min(num_drafted, num_accepted + 1), min(num_drafted, num_asked - 1)
        state.acceptance.observe(reached, num_accepted, self.decay)
        self._global.observe(reached, num_accepted, self.global_decay)
        state.continuation.observe(conts, num_drafted - 1, self.decay)
        self._global_continuation.observe(conts, num_drafted - 1, self.global_decay)

    def record_cost(
        self,
        draft_s: float,
        num_draft_steps: int,
        verify_s: float,
        num_verified_tokens: int,
        batch_size: int = 1,
        step_s: float | None = None,
        num_step_tokens: int | None = None,
    ) -> None:
        """Measured times of one step, after its ``observe`` calls.

        Args:
            draft_s: wall time of the propose call (0 when nothing was proposed).
            num_draft_steps: the k it was asked for (0 for a plain step).
            verify_s: wall time of the target forward (+ verification).
            num_verified_tokens: tokens per request in that forward (k + 1; 1 when plain).
            batch_size: requests in the step.
            step_s: the step's whole time, a draft model's catch-up included (which
                ``draft_s`` leaves out when it is no sample of the draft cost); None:
                ``draft_s + verify_s``. What the drafting runs observed in it are charged.
            num_step_tokens: the tokens the target forward ran (the step size its time is
                kept under); None: ``batch_size * num_verified_tokens``, every request padded
                to the longest (an engine whose runner drops the padding passes fewer).
        """
        self.runs.timed(draft_s + verify_s if step_s is None else step_s)
        self.costs.record(
            draft_s, num_draft_steps, verify_s, num_verified_tokens, batch_size, num_step_tokens
        )

    def _state(self, request_id: str) -> _RequestState:
        state = self._requests.get(request_id)
        if state is None:
            state = self._requests[request_id] = _RequestState(self.runs.new_state())
        return state

    def release(self, request_id: str) -> None:
        state = self._requests.pop(request_id, None)
        if state is not None:
            self.runs.released(request_id, state.probe)

    # ---- decisions -------------------------------------------------------------------------

    def acceptance_estimates(self, request_id: str, k: int) -> list[float]:
        """Estimated conditional acceptance a_0 .. a_{k-1} for the request."""
        state = self._requests.get(request_id)
        own = state.acceptance if state is not None and state.acceptance.reached else None
        out: list[float] = []
        for i in range(k):
            if own is not None and i > 0:
                out.append(own.rate(i, out[-1], self.prior_weight))
                continue
            prior = self._global.rate(i, self.prior_acceptance, self.prior_weight)
            out.append(own.rate(i, prior, self.prior_weight) if own is not None else prior)
        return out

    def continuation_estimates(self, request_id: str, k: int) -> list[float]:
        """Estimated c_1 .. c_{k-1} for the request (1.0 where nothing ever stopped early)."""
        state = self._requests.get(request_id)
        own = state.continuation if state is not None and state.continuation.reached else None
        out = []
        for j in range(1, k):
            prior = self._global_continuation.rate(j - 1, 1.0, self.prior_weight)
            out.append(own.rate(j - 1, prior, self.prior_weight) if own is not None else prior)
        return out

    def confidence_estimates(self, request_id: str) -> tuple[float, float, float]:
        """(q, a_c, a_u) of the confidence-stop model for the request."""
        state = self._requests.get(request_id)
        own = state.confidence if state is not None else None
        g, w = self._global_confidence, self.prior_weight
        q = g.confident_rate(_PRIOR_CONFIDENT, w)
        a_c = g.acceptance(True, _PRIOR_ACCEPT_CONFIDENT, w)
        a_u = g.acceptance(False, _PRIOR_ACCEPT_UNSURE, w)
        if own is None:
            return q, a_c, a_u
        return own.confident_rate(q, w), own.acceptance(True, a_c, w), own.acceptance(False, a_u, w)

    def draft_length_distribution(self, request_id: str, k: int) -> list[float]:
        """P(d = 1) .. P(d = k): how many drafts a step asking for k > 0 gets back."""
        at_least = [1.0]  # P(d >= 1), P(d >= 2), ...
        if self.confidence_stop:
            q = self.confidence_estimates(request_id)[0]
            at_least += [q**j for j in range(1, k)]
        else:
            for c in self.continuation_estimates(request_id, k):
                at_least.append(at_least[-1] * c)
        at_least.append(0.0)
        return [at_least[d] - at_least[d + 1] for d in range(k)]

    def expected_tokens(self, request_id: str, k: int) -> float:
        """E(k): expected tokens from one verify step asking for k drafts."""
        if self.confidence_stop:
            q, a_c, a_u = self.confidence_estimates(request_id)
            head, last = q * a_c, q * a_c + (1 - q) * a_u
            return 1.0 + sum(head ** (j - 1) * last for j in range(1, k + 1))
        total, reach = 1.0, 1.0
        drafted = 1.0  # P(d >= j)
        conts = self.continuation_estimates(request_id, k)
        for j, a in enumerate(self.acceptance_estimates(request_id, k)):
            if j > 0:
                drafted *= conts[j - 1]
            reach *= a
            total += drafted * reach
        return total

    def verify_cost(self, num_tokens: int, batch_size: int = 1) -> float:
        """Estimated target step time for ``num_tokens`` per request in a batch of
        ``batch_size`` (``verify_costs.MeasuredCosts.verify``)."""
        return self.costs.verify(num_tokens, batch_size)

    def plain_cost_measured(self, batch_size: int = 1) -> bool:
        """Whether a step of ``batch_size`` tokens (a plain step of that batch) was timed."""
        return batch_size in self.costs.measured_by_size()

    def draft_cost(self, k: int, batch_size: int = 1) -> float:
        """Estimated propose time for k draft tokens."""
        return self.costs.draft(k, batch_size)

    def step_cost(self, request_id: str, k: int, batch_size: int = 1) -> float:
        """C(k): expected propose + verify time of a step asking for k drafts."""
        if k == 0:
            return self.verify_cost(1, batch_size)
        lengths = self.draft_length_distribution(request_id, k)
        mean_drafts = sum(p * (d + 1) for d, p in enumerate(lengths))
        verify = sum(p * self.verify_cost(d + 2, batch_size) for d, p in enumerate(lengths))
        scale = 1.0 if self.draft_cost_scale is None else self.draft_cost_scale(request_id)
        return self.draft_cost(1, batch_size) * mean_drafts * scale + verify

    def rate(self, request_id: str, k: int, batch_size: int = 1) -> float:
        """Expected tokens per second asking for k drafts."""
        return self.expected_tokens(request_id, k) / self.step_cost(request_id, k, batch_size)

    def explored_k(self, batch_size: int = 1) -> int:
        """Largest k whose step (``batch_size * (k + 1)`` tokens) is at most twice the
        largest step size timed so far (0 before any step was timed)."""
        measured = self.costs.measured_by_size()
        if not measured:
            return 0
        return max(0, min(self.k_max, 2 * max(measured) // batch_size - 1))

    def best_k(self, request_id: str, batch_size: int = 1, drafting: bool = False) -> int:
        """argmax_k rate(k) over 0..explored_k (ties: the smaller k); ``drafting`` (it drafted
        last step): k = 0 only if it beats every k > 0 by :data:`DRAFTING_MARGIN`
        (:data:`EARLY_MARGIN` before the request's :data:`EARLY_STEPS`-th drafting step)."""
        limit = self.explored_k(batch_size)
        rates = [self.rate(request_id, k, batch_size) for k in range(limit + 1)]
        if drafting:
            state = self._requests.get(request_id)
            early = state is not None and state.drafted < EARLY_STEPS
            rates[0] /= 1.0 + (EARLY_MARGIN if early else DRAFTING_MARGIN)
        return max(range(len(rates)), key=lambda k: (rates[k], -k))

    def choose_k(self, request_id: str, batch_size: int = 1) -> int:
        """k for this request's next step (0 = plain decoding)."""
        if self.fixed_k is not None:
            return self.fixed_k
        state = self._state(request_id)
        measured = self.plain_cost_measured(batch_size)
        k = self._choose(state.probe, request_id, batch_size) if measured else 0
        self.runs.chosen(request_id, state.probe, k, batch_size)
        return k

    def _choose(self, state: ProbeState, request_id: str, batch_size: int) -> int:
        k = self.best_k(request_id, batch_size, drafting=bool(state.run))
        state.probing = False
        first, state.started = not state.started, True
        if first and k == 0 and self.k_max > 0:
            # A start probe: one draft token at the request's first decode step, while a
            # draft model's lane holds the whole prompt (no catch-up) and the verify is two
            # tokens. explored_k >= 1 here (a plain step was timed and k_max > 0).
            state.probing = True
            return 1
        if k > 0:
            state.plain_steps = 0
            state.drafting_steps += 1
            reach = min(2 * k + 1, self.explored_k(batch_size))  # twice the step size
            if state.drafting_steps >= self.probe_interval and k < reach:
                state.drafting_steps = 0
                return reach
            return k
        state.plain_steps += 1
        interval = self.probe_interval * state.backoff
        if state.plain_steps >= interval and self.k_max > 0:
            state.plain_steps = 0
            state.probing = True
            # Cheap, and it measures positions 0 and 1. explored_k >= 1 here: a plain step of
            # this batch size was timed, and k_max > 0.
            return min(2, self.explored_k(batch_size))
        return 0
