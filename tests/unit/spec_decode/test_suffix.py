"""Suffix trie bookkeeping and the SuffixDecoding-style proposer."""

from __future__ import annotations

import pytest

from specserve.sampling_params import SamplingParams
from specserve.spec_decode.proposer import ProposeInput
from specserve.spec_decode.suffix import SuffixProposer, SuffixTrie

PARAMS = SamplingParams()


def inp(rid: str, tokens: list[int], k: int) -> ProposeInput:
    return ProposeInput(rid, tokens, k, PARAMS, None)


def test_trie_counts_substrings_and_remove_undoes_extend() -> None:
    trie = SuffixTrie(max_depth=3)
    seq = [1, 2, 3, 1, 2, 4]
    trie.extend(seq)
    assert trie.find([1, 2]).count == 2  # type: ignore[union-attr]
    assert trie.find([1, 2, 3]).count == 1  # type: ignore[union-attr]
    assert trie.find([2, 3, 1]).count == 1  # type: ignore[union-attr]
    assert trie.find([1, 2, 4, 5]) is None
    assert trie.find([3, 1, 2, 4]) is None  # longer than max_depth: never stored
    trie.extend([1, 2, 9])
    assert trie.find([1, 2]).count == 3  # type: ignore[union-attr]
    trie.remove(seq)
    assert trie.find([1, 2]).count == 1  # type: ignore[union-attr]
    assert trie.find([2, 3]) is None
    trie.remove([1, 2, 9])
    assert trie.root.children == {}


def test_incremental_append_equals_whole_insert() -> None:
    a, b = SuffixTrie(4), SuffixTrie(4)
    seq = [5, 1, 5, 1, 2, 5, 1, 2, 3]
    a.extend(seq)
    cursor = b.new_cursor()
    for t in seq:
        cursor = b.append(cursor, t)

    def dump(node, prefix=()):  # type: ignore[no-untyped-def]
        out = {}
        for t, c in node.children.items():
            out[(*prefix, t)] = c.count
            out.update(dump(c, (*prefix, t)))
        return out

    assert dump(a.root) == dump(b.root)


def test_repeated_line_is_drafted_past_the_depth_limit() -> None:
    line = [10, 11, 12, 13, 14]
    proposer = SuffixProposer(max_depth=4, min_match_len=2)
    out = proposer.propose([inp("r", line * 3 + [10, 11], 8)])[0]
    assert out.draft_token_ids == [12, 13, 14, 10, 11, 12, 13, 14]
    assert out.draft_probs is None


def test_most_frequent_continuation_and_confidence_threshold() -> None:
    # After [7, 8]: 9 followed three times, 6 once.
    tokens = [7, 8, 9, 0, 7, 8, 9, 1, 7, 8, 6, 2, 7, 8, 9, 3, 7, 8]
    assert SuffixProposer(min_confidence=0.5).propose([inp("a", tokens, 1)])[0].draft_token_ids == [
        9
    ]
    assert (
        SuffixProposer(min_confidence=0.8).propose([inp("b", tokens, 1)])[0].draft_token_ids == []
    )
    # The confidence is a product: [9] (3/4) then one of 0/1/3 (1/3) -> 0.25.
    two = SuffixProposer(min_confidence=0.3).propose([inp("c", tokens, 4)])[0]
    assert two.draft_token_ids == [9]


def test_no_match_gives_an_empty_draft() -> None:
    proposer = SuffixProposer()
    assert proposer.propose([inp("r", [1, 2, 3, 4, 5], 4)])[0].draft_token_ids == []


def test_global_history_of_finished_outputs() -> None:
    proposer = SuffixProposer(max_history_tokens=12)
    prompt = [100, 101]
    answer = [1, 2, 3, 4, 5, 6, 7]
    # Request A: first propose sees prompt + first token, then the whole output.
    proposer.propose([inp("a", [*prompt, answer[0]], 2)])
    proposer.propose([inp("a", prompt + answer, 2)])
    proposer.release("a")
    # Request B has a different prompt but produces the start of A's answer.
    out = proposer.propose([inp("b", [200, 201, 1, 2, 3], 3)])[0]
    assert out.draft_token_ids == [4, 5, 6]
    proposer.release("b")
    # Two more finished outputs push A's answer out of the 12-token history.
    for rid, tokens in (("c", [50, 51, 52, 53, 54, 55]), ("d", [60, 61, 62, 63, 64, 65])):
        proposer.propose([inp(rid, [9, tokens[0]], 1)])
        proposer.propose([inp(rid, [9, *tokens], 1)])
        proposer.release(rid)
    assert proposer.propose([inp("e", [200, 201, 1, 2, 3], 3)])[0].draft_token_ids == []
    assert proposer.propose([inp("f", [77, 52, 53], 2)])[0].draft_token_ids == [54, 55]


def test_request_state_follows_committed_tokens_and_rebuilds_on_divergence() -> None:
    proposer = SuffixProposer()
    proposer.propose([inp("r", [1, 2, 3, 1, 2], 1)])
    # Diverged history (e.g. recomputed after preemption): the trie is rebuilt.
    out = proposer.propose([inp("r", [4, 5, 6, 4, 5], 2)])[0]
    assert out.draft_token_ids == [6, 4]
    proposer.release("r")
    proposer.release("unknown")  # no-op


@pytest.mark.parametrize(
    "kwargs",
    [{"max_depth": 1}, {"min_match_len": 0}, {"min_confidence": 1.5}, {"max_history_tokens": -1}],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SuffixProposer(**kwargs)  # type: ignore[arg-type]
