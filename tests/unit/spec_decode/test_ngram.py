"""Prompt lookup: table-driven cases for the pure core, and the proposer wrapper."""

from __future__ import annotations

import pytest

from specserve.sampling_params import SamplingParams
from specserve.spec_decode.ngram import NgramProposer, find_ngram_draft
from specserve.spec_decode.proposer import ProposeInput


@pytest.mark.parametrize(
    ("tokens", "n_min", "n_max", "k", "expected"),
    [
        ([], 1, 3, 4, []),  # nothing to match
        ([5], 1, 3, 4, []),  # a tail needs an earlier occurrence
        ([1, 2, 3, 4], 1, 3, 4, []),  # no repetition
        ([1, 2, 3, 9, 1, 2], 2, 2, 3, [3, 9, 1]),  # tail [1, 2] matched at 0
        ([1, 2, 3, 9, 1, 2], 2, 2, 0, []),  # k = 0
        ([1, 2, 3, 9, 1, 2], 3, 4, 3, []),  # tail too long to match
        ([1, 2, 3, 9, 1, 2], 1, 2, 2, [3, 9]),  # longest tail wins
        # The most recent occurrence wins: [7, 1] occurs at 0 and 3; 3 is more recent.
        ([7, 1, 5, 7, 1, 6, 0, 7, 1], 2, 2, 2, [6, 0]),
        # Longer tail beats a more recent shorter one.
        ([4, 7, 1, 5, 0, 7, 1, 6, 4, 7, 1], 2, 3, 1, [5]),
        # Overlapping copy extends a repetition past the end of the committed tokens.
        ([1, 2, 1, 2], 2, 2, 5, [1, 2, 1, 2, 1]),
        ([3, 3, 3], 1, 2, 4, [3, 3, 3, 3]),
        # A repeated line: "a b c ;" x 2, tail "c ;" -> the line again.
        ([10, 11, 12, 13, 10, 11, 12, 13], 2, 4, 6, [10, 11, 12, 13, 10, 11]),
        # n_min = 1 falls back to a single-token match.
        ([8, 2, 9, 2], 1, 3, 2, [9, 2]),
    ],
)
def test_find_ngram_draft(
    tokens: list[int], n_min: int, n_max: int, k: int, expected: list[int]
) -> None:
    assert find_ngram_draft(tokens, n_min, n_max, k) == expected


@pytest.mark.parametrize(("n_min", "n_max", "k"), [(0, 2, 1), (3, 2, 1), (1, 2, -1)])
def test_find_ngram_draft_rejects_bad_arguments(n_min: int, n_max: int, k: int) -> None:
    with pytest.raises(ValueError):
        find_ngram_draft([1, 2, 3], n_min, n_max, k)


def test_proposer_batch_is_ragged_and_deterministic() -> None:
    proposer = NgramProposer(n_min=2, n_max=3)
    params = SamplingParams()
    batch = [
        ProposeInput("a", [1, 2, 3, 1, 2], 2, params, None),
        ProposeInput("b", [4, 5, 6], 3, params, None),
        ProposeInput("c", [9, 9, 9, 9], 3, params, None),
    ]
    out = proposer.propose(batch)
    assert [p.draft_token_ids for p in out] == [[3, 1], [], [9, 9, 9]]
    assert all(p.draft_probs is None for p in out)
    proposer.release("a")  # stateless: a no-op
    with pytest.raises(ValueError):
        NgramProposer(n_min=3, n_max=2)
