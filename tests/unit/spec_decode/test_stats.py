"""Acceptance counters follow vLLM's definitions."""

from __future__ import annotations

import pytest

from specserve.spec_decode.stats import SpecDecodingStats


def test_definitions() -> None:
    s = SpecDecodingStats()
    s.observe(3, 3)
    s.observe(3, 1)
    s.observe(0, 0)  # no draft: not counted
    s.observe(5, 0)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 11, 4)
    assert s.num_accepted_tokens_per_pos == [2, 1, 1, 0, 0]
    assert s.acceptance_rate == pytest.approx(4 / 11)
    assert s.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert s.acceptance_rate_per_pos() == pytest.approx([2 / 3, 1 / 3, 1 / 3, 0, 0])
    assert s.to_dict()["num_drafts"] == 3


def test_merge_and_empty() -> None:
    a, b = SpecDecodingStats(), SpecDecodingStats()
    assert a.acceptance_rate == 0.0 and a.mean_acceptance_length == 1.0
    a.observe(2, 2)
    b.observe(4, 3)
    a.merge(b)
    assert a.num_accepted_tokens_per_pos == [2, 2, 1, 0]
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (2, 6, 5)
    with pytest.raises(ValueError):
        a.observe(2, 3)
