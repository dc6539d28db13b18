"""The batched verifier: greedy rules, agreement with the reference oracle, seeded
reproducibility and (statistically) that sampled output follows the target distribution."""

from __future__ import annotations

import math

import pytest
import torch

from specserve.sampling.sampler import logits_to_probs
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.reference import reference_verify
from specserve.spec_decode.rejection_sampler import cu_num_rows, rejection_sample

GREEDY = SamplingParams(temperature=0.0)


def one_hot_logits(target_ids: list[int], vocab: int = 8) -> torch.Tensor:
    logits = torch.zeros(len(target_ids), vocab)
    logits[torch.arange(len(target_ids)), torch.tensor(target_ids)] = 5.0
    return logits


@pytest.mark.parametrize(
    ("draft", "target_argmax", "expected"),
    [
        ([], [3], [3]),  # empty draft: a plain decode step
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),  # all accepted + bonus
        ([1, 2, 3], [5, 2, 3, 4], [5]),  # first rejected: emit the target's token
        ([1, 2, 3], [1, 6, 3, 4], [1, 6]),  # rejected mid-draft, later matches ignored
        ([1, 2, 3], [1, 2, 7, 4], [1, 2, 7]),
        ([7], [7, 7], [7, 7]),
    ],
)
def test_greedy_accepts_while_draft_equals_argmax(
    draft: list[int], target_argmax: list[int], expected: list[int]
) -> None:
    out = rejection_sample([draft], [None], one_hot_logits(target_argmax), [GREEDY], [None])
    assert out == [expected]


def test_greedy_ragged_batch_uses_each_requests_rows() -> None:
    drafts = [[1, 2], [], [4, 4, 4]]
    target = [1, 2, 0, 5, 4, 6, 4, 4]  # request rows: 3, 1, 4
    assert cu_num_rows([len(d) for d in drafts]) == [0, 3, 4]
    out = rejection_sample(drafts, [None] * 3, one_hot_logits(target), [GREEDY] * 3, [None] * 3)
    assert out == [[1, 2, 0], [5], [4, 6]]


def test_row_count_mismatch_is_an_error() -> None:
    with pytest.raises(AssertionError, match="rows"):
        rejection_sample([[1, 2]], [None], one_hot_logits([1, 2]), [GREEDY], [None])


def _random_case(gen: torch.Generator, vocab: int) -> tuple:
    k = int(torch.randint(0, 6, (1,), generator=gen))
    kind = int(torch.randint(0, 4, (1,), generator=gen))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=1),
        SamplingParams(temperature=0.7, top_k=5, seed=2),
        SamplingParams(temperature=1.3, top_p=0.8, seed=3),
    ][kind]
    target_logits = torch.randn(k + 1, vocab, generator=gen) * 2
    if kind != 0 and bool(torch.rand(1, generator=gen) < 0.5):
        draft_probs = logits_to_probs(torch.randn(k, vocab, generator=gen) * 2, params)
        draft = [int(torch.multinomial(r, 1, generator=gen)) for r in draft_probs] if k else []
    else:
        draft_probs = None
        # Drafts that sometimes agree with the target's argmax.
        draft = [
            int(target_logits[i].argmax())
            if bool(torch.rand(1, generator=gen) < 0.6)
            else int(torch.randint(0, vocab, (1,), generator=gen))
            for i in range(k)
        ]
    return draft, draft_probs, target_logits, params


def test_batched_equals_reference_with_same_seeds() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 11
    cases = [_random_case(gen, vocab) for _ in range(300)]
    for batch_start in range(0, len(cases), 7):
        batch = cases[batch_start : batch_start + 7]
        gens = [torch.Generator().manual_seed(100 + batch_start + j) for j in range(len(batch))]
        out = rejection_sample(
            [c[0] for c in batch],
            [c[1] for c in batch],
            torch.cat([c[2] for c in batch]),
            [c[3] for c in batch],
            gens,
        )
        for j, (draft, probs, logits, params) in enumerate(batch):
            ref_gen = torch.Generator().manual_seed(100 + batch_start + j)
            assert out[j] == reference_verify(draft, probs, logits, params, ref_gen)
            assert 1 <= len(out[j]) <= len(draft) + 1
            assert out[j][:-1] == draft[: len(out[j]) - 1]


def test_seeded_request_is_independent_of_batch_mates() -> None:
    gen = torch.Generator().manual_seed(1)
    vocab = 9
    mine = _random_case(gen, vocab)
    while mine[3].greedy:
        mine = _random_case(gen, vocab)
    others = [_random_case(gen, vocab) for _ in range(5)]
    alone = rejection_sample(
        [mine[0]], [mine[1]], mine[2], [mine[3]], [torch.Generator().manual_seed(7)]
    )[0]
    batch = [others[0], others[1], mine, *others[2:]]
    gens = [None, None, torch.Generator().manual_seed(7), None, None, None]
    together = rejection_sample(
        [c[0] for c in batch],
        [c[1] for c in batch],
        torch.cat([c[2] for c in batch]),
        [c[3] for c in batch],
        gens,
    )[2]
    assert alone == together


# ---- statistics: the verifier's output follows the target distribution ----------------------

VOCAB = 6
TARGET_LOGITS = torch.tensor(
    [[2.0, 1.0, 0.5, 0.0, -1.0, 1.5], [0.0, 2.5, -0.5, 1.0, 0.2, -2.0]]
)  # [2, VOCAB]: rows of a k = 1 verification
DRAFT_LOGITS = torch.tensor([[0.0, 2.0, 1.0, 1.0, 0.5, -1.0]])  # [1, VOCAB]: deliberately off


def chi_square_critical(df: int, z: float = 3.719) -> float:
    """Upper chi-square quantile by Wilson-Hilferty; z = 3.719 is the 1e-4 tail."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic over categories with non-zero expected mass; (stat, df)."""
    n = float(counts.sum())
    keep = probs > 0
    assert int(counts[~keep].sum()) == 0, "a token with zero target probability was emitted"
    expected = probs[keep] * n
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    return stat, int(keep.sum()) - 1


def wrong_residual_verify(draft, draft_probs, target_logits, params, generators):
    """A deliberately wrong verifier: on rejection it resamples from the target itself
    instead of norm(max(0, p_target - p_draft)) -- a classic bug. Must fail the test.
    (Every request of the experiment shares the same two target rows.)"""
    out = []
    p = logits_to_probs(target_logits[:2], params[0])
    for i, d in enumerate(draft):
        q = draft_probs[i] if draft_probs[i] is not None else torch.eye(VOCAB)[d]
        x = d[0]
        if float(torch.rand(1)) < min(1.0, float(p[0, x] / q[0, x])):
            out.append([x, int(torch.multinomial(p[1], 1))])
        else:
            out.append([int(torch.multinomial(p[0], 1))])
    return out


def run_k1_experiment(verify, params: SamplingParams, draft_kind: str, n: int = 20000):
    torch.manual_seed(1234)
    q = logits_to_probs(DRAFT_LOGITS, params)  # [1, VOCAB]
    if draft_kind == "sampled":
        draft_tok = torch.multinomial(q[0], n, replacement=True).tolist()
        drafts = [[t] for t in draft_tok]
        probs: list[torch.Tensor | None] = [q] * n
    else:  # deterministic: always propose token 1 (the draft's argmax), no probabilities
        drafts = [[1]] * n
        probs = [None] * n
    out = verify(drafts, probs, TARGET_LOGITS.repeat(n, 1), [params] * n, [None] * n)
    first = torch.bincount(torch.tensor([o[0] for o in out]), minlength=VOCAB).float()
    second = torch.bincount(
        torch.tensor([o[1] for o in out if len(o) > 1]), minlength=VOCAB
    ).float()
    return first, second


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=4),
    SamplingParams(temperature=1.2, top_p=0.75),
]


@pytest.mark.parametrize("draft_kind", ["sampled", "deterministic"])
@pytest.mark.parametrize("params", PARAMS, ids=["t1", "topk", "topp"])
def test_sampled_output_follows_target_distribution(
    params: SamplingParams, draft_kind: str
) -> None:
    first, second = run_k1_experiment(rejection_sample, params, draft_kind)
    target = logits_to_probs(TARGET_LOGITS, params)  # [2, VOCAB]
    for counts, row in ((first, target[0]), (second, target[1])):
        stat, df = chi_square(counts, row)
        assert stat < chi_square_critical(df), (stat, counts.tolist(), row.tolist())
    assert second.sum() > 1000  # enough accepted drafts to test the bonus row


@pytest.mark.parametrize("draft_kind", ["sampled", "deterministic"])
def test_control_wrong_verifier_is_detected(draft_kind: str) -> None:
    params = PARAMS[0]
    first, _ = run_k1_experiment(wrong_residual_verify, params, draft_kind)
    stat, df = chi_square(first, logits_to_probs(TARGET_LOGITS, params)[0])
    assert stat > chi_square_critical(df), stat
