"""EAGLE-3 and Medusa proposers: catch-up after any acceptance equals a fresh head context,
sampled drafts carry distributions over the target vocabulary, mismatched heads are refused."""

from __future__ import annotations

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading.spec_heads import HeadMismatchError
from specserve.models.decoder import DecoderLM
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.eagle import EagleProposer
from specserve.spec_decode.medusa import MedusaProposer
from specserve.spec_decode.proposer import HiddenStateProposer, ProposeInput
from tests.conftest import make_tiny_model
from tests.heads import make_eagle_head, make_medusa_heads

GREEDY = SamplingParams()


def hidden_of(target: DecoderLM, tokens: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """The target's captured hidden states of every position of ``tokens``."""
    target.capture_layers = layers
    try:
        cache = SingleSequenceCache(target, len(tokens) + 4)
        with torch.inference_mode():
            cache.forward(tokens)
        assert cache.last_captured is not None
        return cache.last_captured
    finally:
        target.capture_layers = ()


def test_proposers_speak_the_hidden_state_protocol() -> None:
    target = make_tiny_model("qwen2")
    eagle = EagleProposer(target, make_eagle_head(target))
    medusa = MedusaProposer(target, make_medusa_heads(target))
    assert isinstance(eagle, HiddenStateProposer) and isinstance(medusa, HiddenStateProposer)
    assert medusa.target_hidden_layers == (target.cfg.num_layers,)
    assert eagle.target_hidden_layers == (0, 1, target.cfg.num_layers)


@pytest.mark.parametrize("accepted", [[0, 0, 0], [3, 3, 1], [1, 2, 0, 3]])
def test_eagle_catch_up_drafts_what_a_fresh_context_drafts(accepted: list[int]) -> None:
    """Whatever was accepted before, drafting after the head caught up equals drafting from a
    head that sees the same committed positions for the first time."""
    target = make_tiny_model("llama", seed=3)
    head = make_eagle_head(target, seed=5, draft_vocab_size=80)
    layers = (0, 1, target.cfg.num_layers)
    proposer = EagleProposer(target, head)
    tokens = [5, 17, 3, 9, 22, 4, 61, 8, 13, 2, 70, 33, 1, 45, 46, 47, 12, 6]
    committed = 6
    hidden = hidden_of(target, tokens, layers)
    shown = 0
    for a in accepted:
        inp = ProposeInput("r", tokens[: committed + 1], 3, GREEDY,
                           hidden_states=hidden[shown:committed], hidden_start=shown)  # fmt: skip
        got = proposer.propose([inp])[0].draft_token_ids
        fresh = EagleProposer(target, head).propose(
            [
                ProposeInput(
                    "x",
                    tokens[: committed + 1],
                    3,
                    GREEDY,
                    hidden_states=hidden[:committed],
                    hidden_start=0,
                )
            ]
        )[0]
        assert got == fresh.draft_token_ids
        assert len(got) == 3 and all(0 <= t < target.cfg.vocab_size for t in got)
        assert all(bool(head.t2d[t]) for t in got)  # drafted from the draft vocabulary only
        shown, committed = committed, committed + a + 1


def test_eagle_gap_in_hidden_states_starts_a_fresh_context() -> None:
    target = make_tiny_model("qwen3", seed=1)
    head = make_eagle_head(target, seed=2)
    proposer = EagleProposer(target, head)
    tokens = list(range(3, 20))
    hidden = hidden_of(target, tokens, proposer.target_hidden_layers)
    proposer.propose([ProposeInput("r", tokens[:5], 2, GREEDY, hidden_states=hidden[:4])])
    # positions 4..7 never shown: the proposer restarts at 8 (as after a prefix-cache hit)
    out = proposer.propose(
        [ProposeInput("r", tokens[:12], 2, GREEDY, hidden_states=hidden[8:11], hidden_start=8)]
    )[0]
    fresh = EagleProposer(target, head).propose(
        [ProposeInput("x", tokens[:12], 2, GREEDY, hidden_states=hidden[8:11], hidden_start=8)]
    )[0]
    assert out.draft_token_ids == fresh.draft_token_ids
    with pytest.raises(ValueError, match="do not end before the last committed token"):
        proposer.propose([ProposeInput("r", tokens[:16], 2, GREEDY, hidden_states=hidden[11:13],
                                       hidden_start=11)])  # fmt: skip


def test_no_hidden_states_means_no_draft() -> None:
    target = make_tiny_model("llama")
    for proposer in (
        EagleProposer(target, make_eagle_head(target)),
        MedusaProposer(target, make_medusa_heads(target)),
    ):
        assert proposer.propose([ProposeInput("r", [1, 2, 3], 3, GREEDY)])[0].draft_token_ids == []
        proposer.release("r")
        proposer.release("unknown")


def test_sampled_drafts_carry_their_distribution_over_the_target_vocabulary() -> None:
    target = make_tiny_model("llama", seed=4)
    head = make_eagle_head(target, seed=6, draft_vocab_size=50)
    params = SamplingParams(temperature=0.8, top_p=0.9)
    tokens = [4, 8, 15, 16, 23, 42]
    for proposer in (
        EagleProposer(target, head),
        MedusaProposer(target, make_medusa_heads(target)),
    ):
        hidden = hidden_of(target, tokens, proposer.target_hidden_layers)
        gen = torch.Generator().manual_seed(0)
        p = proposer.propose([ProposeInput("r", tokens, 3, params, gen, hidden[:5])])[0]
        assert p.draft_probs is not None and p.draft_probs.shape == (3, target.cfg.vocab_size)
        assert torch.allclose(p.draft_probs.sum(-1), torch.ones(3))
        for token, row in zip(p.draft_token_ids, p.draft_probs, strict=True):
            assert row[token] > 0
        if isinstance(proposer, EagleProposer):  # nothing outside the draft vocabulary
            assert float(p.draft_probs[:, ~head.t2d].sum()) == 0.0


def test_medusa_drafts_one_token_per_head_from_the_last_hidden_state() -> None:
    target = make_tiny_model("qwen2", seed=2)
    heads = make_medusa_heads(target, seed=3, num_heads=3)
    proposer = MedusaProposer(target, heads)
    tokens = [9, 8, 7, 6, 5, 4]
    hidden = hidden_of(target, tokens, proposer.target_hidden_layers)
    got = proposer.propose([ProposeInput("r", tokens, 5, GREEDY, hidden_states=hidden[:5])])[0]
    with torch.inference_mode():
        expected = target.compute_logits(heads(hidden[4])).argmax(-1).tolist()
    assert got.draft_token_ids == expected  # k capped at the 3 heads
    # a later call without new hidden states for the same committed tokens redrafts the same
    again = proposer.propose([ProposeInput("r", tokens, 2, GREEDY)])[0]
    assert again.draft_token_ids == expected[:2]


def test_a_head_for_another_target_is_refused_naming_both_values() -> None:
    target = make_tiny_model("llama")
    other = make_tiny_model("llama", vocab_size=120)
    with pytest.raises(HeadMismatchError, match="target vocabulary is 120, the target's is 97"):
        EagleProposer(target, make_eagle_head(other), "h")
    with pytest.raises(HeadMismatchError, match="vocabulary is 120, the target's is 97"):
        MedusaProposer(target, make_medusa_heads(other), "h")
    wide = make_tiny_model("llama", hidden_size=32, num_heads=2, num_kv_heads=1)
    with pytest.raises(HeadMismatchError, match="hidden size is 32, the target's is 64"):
        EagleProposer(target, make_eagle_head(wide), "h")
    with pytest.raises(HeadMismatchError, match="reads target hidden state 7"):
        EagleProposer(target, make_eagle_head(target, aux_layer_ids=(0, 7)), "h")
