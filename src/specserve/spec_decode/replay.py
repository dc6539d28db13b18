"""Replaying greedy speculative decoding from a recorded acceptance trace.

At temperature 0 a step's outcome is a function of where it starts: if ``runs[p]`` is how many
tokens the draft gets right when it drafts after committed position ``p`` (the length of the
common prefix of its greedy draft and the target's greedy continuation), a step at ``p`` with
k drafts accepts ``min(k, runs[p])`` of them and commits that many plus one. Together with a
cost model (verify time per number of tokens verified, draft time per k) this gives the
decode time of any k policy on exactly the same text, without running a model and without
the near-tie flips that make bf16 arms of a live benchmark decode different texts.

Terms:
    trace: the target's greedy output ``tokens`` (the first comes from the prefill) and
        ``runs``, one entry per position that can start a step (``len(tokens) - 1``).
    costs: :class:`StepCosts`, measured once on the machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specserve.spec_decode.draft_model import confident_draft_length
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.proposer import CATCH_UP_STEADY


@dataclass(frozen=True)
class StepCosts:
    """Measured step times of one target/draft pair at batch 1.

    Attributes:
        verify_s: ``verify_s[t - 1]`` is a target forward over t tokens (t = k + 1).
        draft_base_s: fixed time of a propose call (catch-up forward, bookkeeping).
        draft_token_s: time per drafted token.
        catch_up_token_s: time per committed token a draft model catches up beyond the
            steady :data:`CATCH_UP_STEADY` (after steps with k = 0); 0 for proposers that
            keep no state of their own (n-gram) or traces recorded without it.
    """

    verify_s: tuple[float, ...]
    draft_base_s: float
    draft_token_s: float
    catch_up_token_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.verify_s or min(self.verify_s) <= 0:
            raise ValueError("verify_s needs a positive time for every step size from 1 token")
        if min(self.draft_base_s, self.draft_token_s, self.catch_up_token_s) < 0:
            raise ValueError("draft costs must be >= 0")

    @property
    def k_max(self) -> int:
        return len(self.verify_s) - 1

    def draft(self, k: int, behind: int = 1) -> float:
        """A propose call for k tokens whose draft lacks the last ``behind`` committed
        tokens."""
        if k == 0:
            return 0.0
        catch_up = max(0, behind - CATCH_UP_STEADY) * self.catch_up_token_s
        return self.draft_base_s + k * self.draft_token_s + catch_up


@dataclass
class ReplayResult:
    """Decode time and acceptance of one policy on one trace."""

    decode_s: float = 0.0
    num_tokens: int = 0  # tokens after the first (what TPOT divides by)
    num_steps: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    k_history: list[int] = field(default_factory=list)

    @property
    def tpot_s(self) -> float:
        return self.decode_s / self.num_tokens if self.num_tokens else float("nan")

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0


def replay(
    runs: Sequence[int],
    policy: int | KController,
    costs: StepCosts,
    request_id: str = "replay",
    confidences: Sequence[Sequence[float]] | None = None,
    threshold: float = 0.0,
) -> ReplayResult:
    """Decode a trace of ``len(runs) + 1`` tokens with a fixed k or a controller.

    A controller sees exactly what it sees live: ``choose_k`` before each step, then
    ``observe`` and ``record_cost`` with the modelled times; it is released at the end, so
    one controller replayed over several traces carries its global state across them.

    ``confidences[p]`` (the draft's top probability for each token of its greedy draft after
    position p) with ``threshold`` replays the draft model's confidence stop: a step drafts
    up to and including the first token below the threshold, and pays for those forwards.

    A draft model's catch-up is replayed too: after a drafting step it lacks the corrected or
    bonus token (1 behind), each step with k = 0 adds one, and a drafting step pays
    ``costs.catch_up_token_s`` for each beyond :data:`CATCH_UP_STEADY`; as live, the
    controller learns no draft cost from such a step.
    """
    if confidences is not None and len(confidences) != len(runs):
        raise ValueError(f"need one confidence list per run, got {len(confidences)}")
    if isinstance(policy, int) and not (0 <= policy <= costs.k_max):
        raise ValueError(f"k must be in [0, {costs.k_max}] (the measured sizes), got {policy}")
    if any(r < 0 for r in runs):
        raise ValueError("run lengths must be >= 0")
    out = ReplayResult()
    pos, last = 0, len(runs)  # position p: tokens[: p + 1] are committed
    behind = 1  # committed tokens the draft has not seen (the prefill's token)
    try:
        while pos < last:
            k = policy if isinstance(policy, int) else policy.choose_k(request_id, 1)
            k = min(k, last - pos - 1, costs.k_max)  # drafts + 1 bonus fit the budget
            asked = k
            if confidences is not None and k > 0:
                k = confident_draft_length(confidences[pos], k, threshold)
            accepted = min(k, runs[pos])
            draft_s, verify_s = costs.draft(k, behind), costs.verify_s[k]
            caught_up = k > 0 and behind > CATCH_UP_STEADY
            behind = 1 if k > 0 else behind + 1
            out.decode_s += draft_s + verify_s
            out.num_tokens += accepted + 1
            out.num_steps += 1
            out.num_drafted += k
            out.num_accepted += accepted
            out.k_history.append(k)
            if isinstance(policy, KController):
                policy.observe(request_id, k, accepted, num_asked=asked)
                policy.record_cost(0.0 if caught_up else draft_s, 0 if caught_up else k,
                                   verify_s, k + 1, step_s=draft_s + verify_s)  # fmt: skip
            pos += accepted + 1
    finally:
        if isinstance(policy, KController):
            policy.release(request_id)
    return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
