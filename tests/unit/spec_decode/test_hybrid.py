"""HybridProposer: suffix drafts where they get accepted, the draft model elsewhere."""

from __future__ import annotations

import pytest
import torch

from specserve.sampling_params import SamplingParams
from specserve.spec_decode.draft_model import DraftModelProposer
from specserve.spec_decode.hybrid import HybridProposer, expected_accepted
from specserve.spec_decode.proposer import Proposal, ProposeInput
from specserve.spec_decode.suffix import SuffixProposer
from tests.conftest import make_tiny_model

VOCAB = 29


def _hybrid(suffix_prior: float = 1.0) -> HybridProposer:
    """A hybrid over a tiny draft model; by default its suffix starts trusted (the
    mechanisms tested below), the proposer's default is half (tested on its own)."""
    draft = DraftModelProposer(make_tiny_model("llama", seed=5, vocab_size=VOCAB), VOCAB)
    return HybridProposer(SuffixProposer(), draft, suffix_prior=suffix_prior)


def _inp(rid: str, tokens: list[int], k: int = 4) -> ProposeInput:
    return ProposeInput(rid, tokens, k, SamplingParams())


def test_repetitive_request_uses_suffix_and_novel_one_falls_back() -> None:
    hybrid = _hybrid()
    repetitive = [1, 2, 3, 4, 5] * 6 + [1, 2]
    novel = [7, 19, 3, 11, 23, 5]
    rep, nov = hybrid.propose([_inp("rep", repetitive), _inp("nov", novel)])
    assert rep.draft_token_ids[:3] == [3, 4, 5] and rep.draft_probs is None
    # The model fallback always drafts k tokens (a draft model never has "no match").
    assert len(nov.draft_token_ids) == 4
    assert hybrid.num_suffix_drafts == 1 and hybrid.num_model_drafts == 1


def test_fallback_drafts_equal_the_draft_models_own() -> None:
    model = make_tiny_model("llama", seed=5, vocab_size=VOCAB)
    alone = DraftModelProposer(model, VOCAB).propose([_inp("a", [7, 19, 3, 11])])[0]
    hybrid = HybridProposer(SuffixProposer(), DraftModelProposer(model, VOCAB))
    mixed = hybrid.propose([_inp("a", [7, 19, 3, 11])])[0]
    assert mixed.draft_token_ids == alone.draft_token_ids


def test_sampled_fallback_carries_probs() -> None:
    hybrid = _hybrid()
    params = SamplingParams(temperature=0.8, seed=3)
    gen = torch.Generator().manual_seed(3)
    (p,) = hybrid.propose([ProposeInput("s", [7, 19, 3, 11], 3, params, gen)])
    assert p.draft_probs is not None and p.draft_probs.shape == (3, VOCAB)


def test_release_forgets_both_states_and_bad_threshold() -> None:
    hybrid = _hybrid()
    hybrid.propose([_inp("x", [1, 2, 3, 1, 2])])
    hybrid.release("x")
    hybrid.release("never-seen")
    with pytest.raises(ValueError, match="min_suffix_tokens"):
        HybridProposer(SuffixProposer(), hybrid.draft, min_suffix_tokens=0)
    with pytest.raises(ValueError, match="suffix_margin"):
        HybridProposer(SuffixProposer(), hybrid.draft, suffix_margin=1.5)
    assert hybrid.suffix_rate("x") is None


def test_a_suffix_that_keeps_missing_hands_over_to_the_model_and_recovers() -> None:
    hybrid = _hybrid()
    # The trie confidently drafts an old continuation of "1 2" that the target rejects at
    # the first token, while the target accepts whatever the draft model proposes.
    tokens = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]
    sources = []
    for n in range(6, 14):
        before = hybrid.num_suffix_drafts
        (p,) = hybrid.propose([_inp("c", tokens)])
        if hybrid.num_suffix_drafts > before:
            sources.append("suffix")
            tokens += [n, 1, 2]  # rejected at its first token
        else:
            sources.append("model")
            tokens += [*p.draft_token_ids, n]  # all accepted, plus the bonus token
    assert sources[0] == "suffix" and sources[-4:] == ["model"] * 4
    rate = hybrid.suffix_rate("c")
    assert rate is not None and rate < 0.5
    suffix_before = hybrid.num_suffix_drafts
    # The output turns repetitive: the suffix's shadow drafts get confirmed, its rate
    # recovers and it serves the request again.
    period = [20, 21, 22, 23, 24, 25]
    tokens += period * 2
    for _ in range(12):
        hybrid.propose([_inp("c", tokens)])
        tokens += period[:2]
        period = period[2:] + period[:2]
    assert hybrid.num_suffix_drafts > suffix_before
    rate = hybrid.suffix_rate("c")
    assert rate is not None and rate > 0.8


def test_repetitive_request_keeps_the_suffix() -> None:
    hybrid = _hybrid()
    tokens = [1, 2, 3, 4, 5] * 4
    for _ in range(6):
        (p,) = hybrid.propose([_inp("r", tokens)])
        assert p.draft_token_ids == [1, 2, 3, 4]
        tokens += [1, 2, 3, 4, 5]  # all four accepted, then the bonus token
    assert hybrid.num_model_drafts == 0 and hybrid.num_suffix_drafts == 6


class _FixedSuffix(SuffixProposer):
    """A suffix proposer whose drafts are set by the test (the choice is what is tested)."""

    def __init__(self, draft: list[int]) -> None:
        super().__init__()
        self.draft = draft

    def propose(self, batch):  # type: ignore[no-untyped-def]
        return [Proposal(list(self.draft[: inp.num_draft_tokens])) for inp in batch]


def test_expected_accepted_is_the_geometric_sum() -> None:
    assert expected_accepted(1.0, 4) == 4
    assert expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted(0.9, 0) == 0


def test_a_suffix_draft_shorter_than_the_models_expected_yield_falls_back() -> None:
    """Two trie tokens against a k = 4 draft the model gets accepted whole: the model serves;
    four trie tokens: the suffix; and once the model's drafts keep failing (its expected
    yield under two tokens) the short suffix draft serves again."""
    model = make_tiny_model("llama", seed=5, vocab_size=VOCAB)
    suffix = _FixedSuffix([3, 4])
    hybrid = HybridProposer(suffix, DraftModelProposer(model, VOCAB), suffix_prior=1.0)
    tokens = [7, 19, 3, 11]
    hybrid.propose([_inp("a", tokens)])
    assert (hybrid.num_suffix_drafts, hybrid.num_model_drafts) == (0, 1)
    suffix.draft = [3, 4, 5, 6]
    hybrid.propose([_inp("a", tokens)])
    assert (hybrid.num_suffix_drafts, hybrid.num_model_drafts) == (1, 1)
    suffix.draft = [3, 4]
    for _ in range(6):  # both sources' drafts rejected at the first token
        (p,) = hybrid.propose([_inp("a", tokens)])
        tokens = [*tokens, (p.draft_token_ids[0] + 1) % VOCAB]
    assert hybrid.num_suffix_drafts > 1


def test_suffix_drafts_teach_the_controller_nothing_about_the_models_cost() -> None:
    """A step the suffix served ran no draft forward: its near-zero draft time is not a
    sample of the draft model's cost. A step the model served is, per forward; a proposer
    without the count (n-gram) is charged per token asked for, as before."""
    from specserve.spec_decode.ngram import NgramProposer
    from specserve.spec_decode.proposer import draft_cost_sample

    hybrid = _hybrid()
    (p,) = hybrid.propose([_inp("r", [1, 2, 3, 4, 5] * 4)])
    assert hybrid.num_suffix_drafts == 1 and hybrid.last_num_forwards == 0
    assert draft_cost_sample(hybrid, 1e-5, len(p.draft_token_ids)) == (0.0, 0)
    hybrid.draft.prefill("n", [7, 19, 3])  # so the propose catches up one token, as in steady state
    hybrid.propose([_inp("n", [7, 19, 3, 11])])
    assert hybrid.num_model_drafts == 1 and hybrid.last_num_forwards == 4
    assert draft_cost_sample(hybrid, 0.04, 4) == (0.04, 4)
    assert draft_cost_sample(NgramProposer(2, 4), 1e-5, 3) == (1e-5, 3)


def test_the_prompt_pass_runs_ahead_of_the_first_draft() -> None:
    """``prefill`` hands the prompt to the draft model (as the draft-model method does), so
    the first draft-model call of a request catches up one token, not the whole prompt."""
    hybrid = _hybrid()
    prompt = [7, 19, 3, 11, 23, 5, 17]
    hybrid.prefill("n", prompt)
    hybrid.propose([_inp("n", [*prompt, 2])])
    assert hybrid.num_model_drafts == 1 and hybrid.last_catch_up_tokens == 1
    cold = _hybrid()
    cold.propose([_inp("n", [*prompt, 2])])
    assert cold.last_catch_up_tokens == len(prompt) + 1


def test_once_costs_are_known_the_choice_weighs_tokens_per_second() -> None:
    """A 4-token suffix draft against a k = 8 model draft expected to be accepted whole: by
    rates alone the model serves; with a draft-model call costing twice a verify, the free
    suffix draft gives more tokens per second (5 / 1 verify against 9 / 3); with a nearly
    free draft model, the model again (9 / 1.03 verifies)."""
    model = make_tiny_model("llama", seed=5, vocab_size=VOCAB)
    hybrid = HybridProposer(
        _FixedSuffix([3, 4, 5, 6]), DraftModelProposer(model, VOCAB), suffix_prior=1.0
    )
    tokens = [7, 19, 3, 11]
    hybrid.propose([_inp("a", tokens, k=8)])
    assert (hybrid.num_suffix_drafts, hybrid.num_model_drafts) == (0, 1)  # no costs yet
    assert hybrid.model_call_s is not None and hybrid.model_call_s > 0  # timed by itself
    hybrid.record_verify(0.0)  # not a time: ignored
    assert hybrid.verify_s is None
    hybrid.record_verify(0.030)
    hybrid.model_call_s = 0.060
    hybrid.release("a")
    hybrid.propose([_inp("a", tokens, k=8)])
    assert (hybrid.num_suffix_drafts, hybrid.num_model_drafts) == (1, 1)
    hybrid.model_call_s = 0.001
    hybrid.release("a")
    hybrid.propose([_inp("a", tokens, k=8)])
    assert (hybrid.num_suffix_drafts, hybrid.num_model_drafts) == (1, 2)
    with pytest.raises(ValueError, match="cost_decay"):
        HybridProposer(SuffixProposer(), hybrid.draft, cost_decay=1.0)


def test_the_model_yield_per_draft_is_measured_once_scored() -> None:
    hybrid = _hybrid()
    hybrid.propose([_inp("n", [7, 19, 3, 11], k=4)])  # the model serves (no suffix match)
    state = hybrid._requests["n"]
    assert state.model.accepted_per_draft(4) == expected_accepted(1.0, 4)  # the prior's
    (drafted,) = [state.pending.model] if state.pending else [None]
    assert drafted is not None and len(drafted) == 4
    hybrid.propose([_inp("n", [7, 19, 3, 11, drafted[0], (drafted[1] + 1) % VOCAB], k=4)])
    assert state.model.accepted_per_draft(4) == pytest.approx(1.0)  # one draft, one accepted


def test_the_controller_costs_only_the_drafts_the_model_makes() -> None:
    """The k controller scales the draft model's cost by the share of a request's steps the
    model served (suffix drafts cost no forward); a proposer without the share changes
    nothing."""
    from specserve.spec_decode.k_controller import KController

    hybrid = HybridProposer(_FixedSuffix([1, 2, 3, 4]), _hybrid().draft, suffix_prior=1.0)
    controller = KController(8)
    controller.record_cost(0.0, 0, 0.030, 1)
    controller.record_cost(0.040, 4, 0.036, 5)
    full = controller.step_cost("r", 4)
    controller.link_proposer(hybrid)
    assert controller.step_cost("r", 4) == full  # an unseen request: the model's cost
    for _ in range(20):
        hybrid.propose([_inp("r", [1, 2, 3, 4, 5] * 3, k=4)])
    assert hybrid.num_model_drafts == 0 and hybrid.draft_cost_scale("r") < 0.02
    assert controller.step_cost("r", 4) < full - 0.035  # the 4 draft forwards nearly gone
    controller.link_proposer(object())
    assert controller.draft_cost_scale is None and controller.step_cost("r", 4) == full


def test_the_loop_reports_verify_times_and_links_the_controller() -> None:
    from specserve.sampling_params import SamplingParams
    from specserve.spec_decode.k_controller import KController
    from specserve.spec_decode.speculative_loop import generate_speculative

    target = make_tiny_model("llama", seed=2, vocab_size=VOCAB)
    hybrid = _hybrid()
    controller = KController(4)
    generate_speculative(
        target, hybrid, [1, 2, 3, 1, 2], SamplingParams(max_tokens=12), (), controller
    )
    assert hybrid.verify_s is not None and hybrid.verify_s > 0
    assert controller.draft_cost_scale == hybrid.draft_cost_scale


def test_a_fresh_requests_suffix_serves_once_its_shadow_drafts_are_accepted() -> None:
    """By default a request's suffix starts at half the model's rate: a trie match on its
    first step goes to the model; once the suffix's own drafts, scored against what the
    target committed, have been accepted, the suffix serves."""
    hybrid = HybridProposer(SuffixProposer(), _hybrid().draft)  # the defaults
    assert hybrid.suffix_prior == 0.5
    tokens = [1, 2, 3, 4, 5] * 3
    sources = []
    for _ in range(4):
        before = hybrid.num_suffix_drafts
        hybrid.propose([_inp("r", tokens)])
        sources.append("suffix" if hybrid.num_suffix_drafts > before else "model")
        tokens += [1, 2, 3, 4, 5]  # the repetition goes on: the trie's drafts are right
    assert sources[0] == "model" and sources[-1] == "suffix"
    with pytest.raises(ValueError, match="suffix_prior"):
        HybridProposer(SuffixProposer(), hybrid.draft, suffix_prior=0.0)
