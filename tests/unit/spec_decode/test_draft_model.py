"""Draft-model proposer: vocabulary checks, lane rollback/catch-up and batching."""

from __future__ import annotations

import copy

import pytest
import torch

from specserve.sampling_params import SamplingParams
from specserve.spec_decode.draft_model import (
    MAX_VOCAB_PADDING,
    DraftModelProposer,
    VocabMismatchError,
    check_vocab_compatible,
    confident_draft_length,
)
from specserve.spec_decode.proposer import ProposeInput
from tests.conftest import make_tiny_model

GREEDY = SamplingParams()


def inp(rid: str, tokens: list[int], k: int, params: SamplingParams = GREEDY, seed=None):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return ProposeInput(rid, tokens, k, params, gen)


def fresh_draft(proposer: DraftModelProposer, tokens: list[int], k: int) -> list[int]:
    other = DraftModelProposer(proposer.model, proposer.target_vocab_size, max_model_len=128)
    return other.propose([inp("x", tokens, k)])[0].draft_token_ids


def count_fed_tokens(proposer: DraftModelProposer) -> list[int]:
    """Wrap the proposer's forward: the returned list gets the tokens each forward ran."""
    fed: list[int] = []
    forward = proposer._forward

    def counting(lanes, feeds):  # type: ignore[no-untyped-def]
        fed.append(sum(len(f) for f in feeds.values()))
        return forward(lanes, feeds)

    proposer._forward = counting  # type: ignore[method-assign]
    return fed


class ToyTokenizer:
    """Character-level tokenizer; ``shift`` makes a different (incompatible) vocabulary."""

    def __init__(self, vocab_size: int = 97, shift: int = 0, eos: tuple[int, ...] = (96,)):
        self.vocab_size, self.shift, self.eos_token_ids = vocab_size, shift, eos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [(ord(c) + self.shift) % self.vocab_size for c in text]


def test_vocab_check() -> None:
    check_vocab_compatible(151936, 151936)
    check_vocab_compatible(152064, 151936)  # padding rows only
    with pytest.raises(VocabMismatchError, match="differs"):
        check_vocab_compatible(151936, 151936 - MAX_VOCAB_PADDING - 1)
    check_vocab_compatible(97, 97, ToyTokenizer(), ToyTokenizer())
    with pytest.raises(VocabMismatchError, match="encode"):
        check_vocab_compatible(97, 97, ToyTokenizer(), ToyTokenizer(shift=1))
    with pytest.raises(VocabMismatchError, match="eos_token_ids"):
        check_vocab_compatible(97, 97, ToyTokenizer(), ToyTokenizer(eos=(0,)))
    with pytest.raises(VocabMismatchError):
        DraftModelProposer(make_tiny_model(vocab_size=2000), target_vocab_size=97)


def test_rollback_and_catch_up_match_a_fresh_lane() -> None:
    """Whatever the history (drafts fully/partly accepted, text rewritten), a lane drafts
    what a proposer seeing the tokens for the first time drafts."""
    proposer = DraftModelProposer(make_tiny_model("qwen2", seed=1), 97, max_model_len=128)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 96, (6,), generator=g).tolist()
    for step in range(12):
        k = [1, 3, 5, 2][step % 4]
        draft = proposer.propose([inp("r", tokens, k)])[0].draft_token_ids
        assert len(draft) == k
        assert draft == fresh_draft(proposer, tokens, k)
        # The lane holds the committed tokens and every draft but the last.
        assert proposer._lanes["r"].tokens == tokens + draft[:-1]
        accept = step % (k + 1)  # every acceptance length 0..k over the steps
        bonus = int(torch.randint(0, 96, (1,), generator=g))
        tokens = tokens + draft[:accept] + [bonus]
        if step == 7:
            tokens = [*tokens[:4], 1, 2, 3]  # diverged history (e.g. recompute)


def test_batch_equals_requests_alone() -> None:
    model = make_tiny_model("llama", seed=2)
    seqs = [[5, 6, 7], list(range(20, 40)), [9], [3, 1, 4, 1, 5, 9, 2, 6]]
    ks = [4, 2, 6, 1]
    batched = DraftModelProposer(model, 97, max_model_len=128)
    out = batched.propose(
        [inp(f"r{i}", s, k) for i, (s, k) in enumerate(zip(seqs, ks, strict=True))]
    )
    for s, k, p in zip(seqs, ks, out, strict=True):
        assert p.draft_token_ids == fresh_draft(batched, s, k)
    # A second, ragged step: each request's history advanced differently.
    seqs2 = [
        s + p.draft_token_ids[:j] + [11] for j, (s, p) in enumerate(zip(seqs, out, strict=True))
    ]
    out2 = batched.propose([inp(f"r{i}", s, 3) for i, s in enumerate(seqs2)])
    for s, p in zip(seqs2, out2, strict=True):
        assert p.draft_token_ids == fresh_draft(batched, s, 3)


def test_sampled_draft_returns_processed_probs_and_is_seeded() -> None:
    model = make_tiny_model("qwen3", seed=3)
    params = SamplingParams(temperature=0.8, top_k=10)
    a = DraftModelProposer(model, 97).propose([inp("r", [1, 2, 3], 4, params, seed=5)])[0]
    b = DraftModelProposer(model, 97).propose([inp("r", [1, 2, 3], 4, params, seed=5)])[0]
    assert a.draft_token_ids == b.draft_token_ids and len(a) == 4
    assert a.draft_probs is not None and a.draft_probs.shape == (4, 97)
    torch.testing.assert_close(a.draft_probs.sum(-1), torch.ones(4))
    assert int((a.draft_probs > 0).sum(-1).max()) <= 10  # top-k applied like the target's
    for tok, row in zip(a.draft_token_ids, a.draft_probs, strict=True):
        assert row[tok] > 0


def test_vocab_padding_rows_are_never_proposed() -> None:
    # Draft with 3 extra (padding) rows that it strongly prefers: they must never come out.
    draft = make_tiny_model("llama", seed=4, vocab_size=100)
    with torch.no_grad():
        draft.lm_head.weight[97:] = draft.lm_head.weight[:3] * 50
    proposer = DraftModelProposer(draft, target_vocab_size=97)
    params = SamplingParams(temperature=1.0)
    for p in proposer.propose([inp("a", [1, 2, 3], 5), inp("b", [4, 5], 5, params, seed=1)]):
        assert all(t < 97 for t in p.draft_token_ids)
    assert p.draft_probs is not None and p.draft_probs.shape == (5, 97)
    # A draft with fewer rows than the target: its probabilities are zero-padded.
    small = DraftModelProposer(make_tiny_model("llama", seed=4, vocab_size=95), 97)
    q = small.propose([inp("c", [1, 2], 2, params, seed=2)])[0].draft_probs
    assert q is not None and q.shape == (2, 97) and float(q[:, 95:].sum()) == 0.0


def test_lanes_context_room_and_release() -> None:
    proposer = DraftModelProposer(make_tiny_model(seed=5), 97, max_num_seqs=2, max_model_len=16)
    proposer.propose([inp("a", [1, 2], 2), inp("b", [3, 4], 2)])
    with pytest.raises(RuntimeError, match="no free lane"):
        proposer.propose([inp("c", [5], 2)])
    proposer.release("a")
    proposer.release("never-seen")  # no-op
    assert len(proposer.propose([inp("c", [5], 2)])[0]) == 2
    # Drafts fed back must fit the lane: 14 tokens + k - 1 <= 16 -> k <= 3.
    assert len(proposer.propose([inp("b", list(range(14)), 8)])[0]) == 3
    assert len(proposer.propose([inp("b", list(range(17)), 8)])[0]) == 0


def test_a_new_request_takes_the_free_lane_sharing_its_prefix_and_runs_only_the_rest() -> None:
    """A released lane keeps its keys and values: a new request whose prompt begins as a free
    lane's tokens takes that lane (the longest shared prefix among the free lanes), runs only
    the rest of its prompt, and drafts what a fresh proposer drafts (the draft's prefix
    cache); a prompt sharing nothing takes the least recently freed lane."""
    model = make_tiny_model("qwen2", seed=8)
    proposer = DraftModelProposer(model, 97, max_num_seqs=3, max_model_len=64)
    shared = list(range(30, 50))
    proposer.prefill("a", [*shared, 1, 2])
    proposer.propose([inp("a", [*shared, 1, 2, 3], 3)])
    proposer.prefill("b", [*shared[:5], 60])
    lane_a, lane_b = proposer._lanes["a"], proposer._lanes["b"]
    proposer.release("a")
    proposer.release("b")  # freed last, but shares only 5 tokens with the prompt below
    fed = count_fed_tokens(proposer)
    prompt = [*shared, 7, 8, 9]
    assert proposer.uncached_tokens("c", prompt) == 3  # what the pass below runs
    assert proposer.uncached_tokens("c", list(range(65))) == 0  # too long for a lane
    proposer.prefill("c", prompt)
    assert proposer._lanes["c"] is lane_a and fed == [3]
    assert proposer._lanes["c"].tokens == prompt
    draft = proposer.propose([inp("c", [*prompt, 5], 4)])[0].draft_token_ids
    assert draft == fresh_draft(proposer, [*prompt, 5], 4)
    proposer.release("c")
    fed.clear()
    assert proposer.uncached_tokens("d", prompt) == 1
    proposer.prefill("d", prompt)  # the same prompt again: only its last token runs
    assert proposer.uncached_tokens("d", [*prompt, 4, 5]) == 2  # its own lane's prefix
    assert proposer._lanes["d"] is lane_a and fed == [1]
    assert proposer.uncached_tokens("e", [90, 91]) == 2
    proposer.prefill("e", [90, 91])  # nothing shared: the least recently freed lane (unused)
    assert proposer._lanes["e"] not in (lane_a, lane_b) and fed == [1, 2]
    draft = proposer.propose([inp("e", [90, 91, 92], 3)])[0].draft_token_ids
    assert draft == fresh_draft(proposer, [90, 91, 92], 3)


def test_a_prompt_read_in_chunks_drafts_as_one_read_at_once() -> None:
    """``prefill(..., max_tokens=m)`` runs the next m tokens the lane lacks and returns how
    many are left; chunk after chunk (a request's committed tokens growing between them) the
    lane ends up holding what one pass gives, and drafts the same."""
    proposer = DraftModelProposer(make_tiny_model("qwen2", seed=9), 97, max_model_len=64)
    tokens = list(range(20, 43))  # 23 tokens
    fed = count_fed_tokens(proposer)
    assert proposer.prefill("r", tokens[:20], max_tokens=8) == 12
    assert proposer.uncached_tokens("r", tokens[:20]) == 12
    assert proposer.prefill("r", tokens[:21], max_tokens=8) == 5  # one more token committed
    assert proposer.prefill("r", tokens, max_tokens=0) == 7  # nothing runs
    assert proposer.prefill("r", tokens, max_tokens=8) == 0
    assert fed == [8, 8, 7] and proposer._lanes["r"].tokens == tokens
    draft = proposer.propose([inp("r", [*tokens, 5], 4)])[0].draft_token_ids
    assert draft == fresh_draft(proposer, [*tokens, 5], 4)
    assert fed[3] == 1  # the propose call caught up one token


def test_identical_draft_model_proposes_the_targets_greedy_tokens() -> None:
    from specserve.spec_decode.plain_loop import generate_plain

    target = make_tiny_model("qwen2", seed=6)
    prompt = [10, 20, 30]
    plain = generate_plain(target, prompt, SamplingParams(max_tokens=9, ignore_eos=True), (96,))
    proposer = DraftModelProposer(copy.deepcopy(target), 97)
    draft = proposer.propose([inp("r", [*prompt, plain.token_ids[0]], 8)])[0]
    assert draft.draft_token_ids == plain.token_ids[1:9]


def test_prefill_then_propose_equals_propose() -> None:
    proposer = DraftModelProposer(make_tiny_model("qwen2", seed=7), 97, max_model_len=64)
    prompt = [4, 8, 15, 16, 23, 42]
    proposer.prefill("r", prompt)
    assert proposer._lanes["r"].tokens == prompt
    draft = proposer.propose([inp("r", [*prompt, 7], 4)])[0].draft_token_ids
    assert draft == fresh_draft(proposer, [*prompt, 7], 4)
    assert proposer._lanes["r"].tokens == [*prompt, 7, *draft[:-1]]


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.9)])
def test_confidence_stop_cuts_the_draft_after_its_first_unsure_token(
    params: SamplingParams,
) -> None:
    """With a threshold the draft is the unstopped draft cut after its first token whose top
    probability is below it (that token kept), and only those forwards run: the rule
    ``confident_draft_length`` states and replays of recorded traces apply."""
    model = make_tiny_model("qwen2", seed=8)
    prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8], list(range(30, 50)), [9, 9, 9]]
    full = DraftModelProposer(model, 97)
    batch = [inp(f"r{i}", p, 6, params, seed=i) for i, p in enumerate(prompts)]
    unstopped = full.propose(batch)
    confs = full.last_confidences
    assert [len(c) for c in confs] == [6] * 4 and full.last_num_forwards == 6
    assert all(0.0 < c <= 1.0 for row in confs for c in row)
    # A threshold between the confidences seen, so that drafts stop at different lengths.
    threshold = sorted(c for row in confs for c in row)[len(prompts) * 6 // 3]
    stopped = DraftModelProposer(model, 97, confidence_threshold=threshold)
    batch = [inp(f"r{i}", p, 6, params, seed=i) for i, p in enumerate(prompts)]
    got = stopped.propose(batch)
    lengths = [confident_draft_length(c, 6, threshold) for c in confs]
    assert len(set(lengths)) > 1, "the threshold should stop some drafts and not others"
    for p, full_p, n in zip(got, unstopped, lengths, strict=True):
        assert p.draft_token_ids == full_p.draft_token_ids[:n]
        if params.greedy:
            assert p.draft_probs is None
        else:
            assert p.draft_probs is not None and full_p.draft_probs is not None
            torch.testing.assert_close(p.draft_probs, full_p.draft_probs[:n])
    assert stopped.last_num_forwards == max(lengths)


def test_confidence_threshold_is_checked() -> None:
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="confidence_threshold"):
            DraftModelProposer(make_tiny_model(seed=9), 97, confidence_threshold=bad)


def test_draft_cost_is_charged_per_forward_run() -> None:
    """The k controller learns a draft's cost per forward it ran: a confidence stop's short
    draft is not charged as k tokens; a catch-up burst teaches nothing."""
    from specserve.spec_decode.proposer import draft_cost_sample

    model = make_tiny_model("qwen2", seed=8)
    stopped = DraftModelProposer(model, 97, confidence_threshold=0.99)  # stops after 1 token
    stopped.prefill("r", [3, 1])  # so the propose catches up one token, as in steady state
    assert len(stopped.propose([inp("r", [3, 1, 4], 6)])[0]) == 1
    assert stopped.last_num_forwards == 1
    assert draft_cost_sample(stopped, 0.02, 6) == (0.02, 1)
    full = DraftModelProposer(model, 97)
    full.prefill("r", [3, 1])
    full.propose([inp("r", [3, 1, 4], 6)])
    assert full.last_num_forwards == 6 and draft_cost_sample(full, 0.12, 6) == (0.12, 6)
    full.propose([inp("r", [3, 1, 4, 5, 9, 2, 6, 5, 3], 2)])  # catches up 6 committed tokens
    assert draft_cost_sample(full, 0.05, 2) == (0.0, 0)
