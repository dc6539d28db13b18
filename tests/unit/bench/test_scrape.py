"""Prometheus parsing and acceptance statistics from counter deltas."""

from __future__ import annotations

import pytest

from specserve.bench.scrape import Acceptance, SpecCounters, parse_prometheus


def exposition(drafts: int, tokens: int, accepted: int, per_pos: list[int], suffix: str) -> str:
    lines = [
        "# HELP vllm:spec_decode_num_drafts drafts",
        "# TYPE vllm:spec_decode_num_drafts counter",
        f'vllm:spec_decode_num_drafts{suffix}{{model_name="m",engine="0"}} {drafts}.0',
        f'vllm:spec_decode_num_draft_tokens{suffix}{{model_name="m"}} {tokens}',
        f'vllm:spec_decode_num_accepted_tokens{suffix}{{model_name="m"}} {accepted}',
        'vllm:num_requests_running{model_name="m"} 3',
        "process_cpu_seconds_total 12.5 1700000000",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos{suffix}{{model_name="m",position="{i}"}} {v}'
        for i, v in enumerate(per_pos)
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("suffix", ["_total", ""])
def test_acceptance_from_deltas(suffix: str) -> None:
    before = SpecCounters.from_samples(
        parse_prometheus(exposition(10, 40, 20, [9, 7, 3, 1], suffix))
    )
    after = SpecCounters.from_samples(
        parse_prometheus(exposition(110, 440, 270, [99, 87, 53, 31], suffix))
    )
    acc = Acceptance.from_delta(after.minus(before))
    assert acc.available
    assert acc.acceptance_rate == pytest.approx(250 / 400)
    assert acc.mean_acceptance_length == pytest.approx(1 + 250 / 100)
    assert acc.per_position == pytest.approx([0.90, 0.80, 0.50, 0.30])


def test_label_sets_are_summed() -> None:
    text = (
        'vllm:spec_decode_num_drafts_total{engine="0"} 5\n'
        'vllm:spec_decode_num_drafts_total{engine="1"} 7\n'
    )
    assert SpecCounters.from_samples(parse_prometheus(text)).drafts == 12


def test_no_counters_means_unavailable() -> None:
    acc = Acceptance.from_delta(SpecCounters.from_samples(parse_prometheus("up 1\n")))
    assert not acc.available and "no vllm:spec_decode" in acc.note


def test_zero_drafts_gives_none_not_division_error() -> None:
    text = exposition(3, 12, 6, [3], "_total")
    same = SpecCounters.from_samples(parse_prometheus(text))
    acc = Acceptance.from_delta(same.minus(same))
    assert acc.available and acc.acceptance_rate is None and acc.mean_acceptance_length is None


def test_escaped_label_and_special_values() -> None:
    samples = parse_prometheus('m{a="x\\"y",b="z"} NaN\nn +Inf\n')
    assert ("m", (("a", 'x\\"y'), ("b", "z"))) in samples
    assert samples[("n", ())] == float("inf")


def test_bad_line_raises_with_line_number() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_prometheus("ok 1\nthis is not a sample\n")


def test_plus_accumulates_batches() -> None:
    a = SpecCounters(
        drafts=2, draft_tokens=8, accepted_tokens=4, accepted_per_pos={0: 2}, present=True
    )
    total = SpecCounters().plus(a).plus(a)
    assert total.drafts == 4 and total.accepted_per_pos == {0: 4} and total.present
