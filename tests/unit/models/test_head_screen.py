"""A greedy draft's LM head screened in two-bit codes (``models/native/head_screen.py``,
``csrc/head_screen.cpp``): the coarse scores' documented arithmetic, the candidates finished
with the head's own kernel, batch invariance, the vocabulary bound, and the draft proposer
on it (the same proposals as the full head, the switch)."""

from __future__ import annotations

import pytest
import torch

from specserve.models.native import head_screen, int4_native
from specserve.models.quant.int4_weight import quantize_int4
from specserve.models.quant.layers import Int4Linear
from specserve.models.quant.quantize import quantize_model
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.draft_model import DraftModelProposer
from specserve.spec_decode.proposer import ProposeInput
from tests.conftest import make_tiny_model

native = pytest.mark.skipif(
    not int4_native.available(), reason=f"native int4 kernel: {int4_native.unavailable_reason()}"
)


def _head(n: int = 1000, k: int = 128, seed: int = 0) -> Int4Linear:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=gen) * 0.05
    weight[7] *= 1.5  # a row that often wins
    weight[n - 100] = weight[7]  # and its twin: a tie, which goes to the lower row
    weight[0] = 0.0  # a row of logit 0: mid-ranking, never among the candidates here
    return Int4Linear(quantize_int4(weight, 64), None, torch.bfloat16)


def _screened(n: int = 1000, k: int = 128, seed: int = 0):  # type: ignore[no-untyped-def]
    """A random int4 head and its screen."""
    linear = _head(n, k, seed)
    screen = head_screen.for_head(linear)
    assert screen is not None
    return linear, screen


def _x(m: int, k: int = 128, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, k, generator=gen))
    return x.to(torch.bfloat16)


def _coarse_reference(x: torch.Tensor, screen: head_screen.HeadScreen) -> torch.Tensor:
    """The documented coarse scores in float64: codes and fp16 constants unpacked from the
    layout, x rounded to int8 per 64 inputs (step max |x| / 127, half to even), the minimums'
    term on x's exact group sums."""
    codes = screen.codes  # [tiles, groups, 5, 64]
    tiles, groups = codes.shape[:2]
    blocks = codes[:, :, :4].reshape(tiles, groups, 4, 16, 4).to(torch.int64)  # [t, g, b, i, e]
    q = torch.stack([(blocks >> (2 * j)) & 3 for j in range(4)], -1)  # [t, g, b, i, e, j]
    q = q.permute(0, 3, 1, 2, 5, 4).reshape(tiles * 16, groups * 64).double()  # k = 16b + 4j + e
    consts = codes[:, :, 4].contiguous().view(torch.float16).view(tiles, groups, 2, 16)
    s = consts[:, :, 0].permute(0, 2, 1).reshape(tiles * 16, groups).double()
    mn = consts[:, :, 1].permute(0, 2, 1).reshape(tiles * 16, groups).double()
    xf = x.float().view(x.shape[0], groups, 64)
    amax = xf.abs().amax(-1, keepdim=True)
    xq = torch.round(xf * torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))).double()
    step = (amax / 127.0).double()
    isum = torch.einsum("mgi,ngi->mng", xq, q.view(-1, groups, 64))
    scores = (isum * step.view(x.shape[0], 1, groups) * s).sum(-1)
    scores += (xf.sum(-1).double()[:, None, :] * mn).sum(-1)
    return scores[:, : screen.out_features]


@native
def test_candidates_and_tail_follow_the_coarse_scores() -> None:
    _, screen = _screened()
    assert screen.top_n == 64
    x = _x(3)
    cand, stats = head_screen.screen(x, screen, vocab=1000)
    ref = _coarse_reference(x, screen)
    for m in range(3):
        order = ref[m].argsort(descending=True)
        # the candidates are the reference's top 64 (the chosen one moved to the front)
        assert set(cand[m].tolist()) == set(order[:64].tolist())
        assert stats[m, 1].item() == pytest.approx(ref[m, order[0]].item(), rel=1e-4)
        rest = ref[m, order[64:]]
        tail = torch.exp(rest - ref[m, order[0]]).sum().item()
        assert stats[m, 2].item() == pytest.approx(tail, rel=1e-4)


@native
def test_the_chosen_token_and_its_probability_are_the_full_heads() -> None:
    linear, screen = _screened()
    x = _x(6, seed=3)
    x[0] = linear(torch.eye(128)).T[7] * 50  # row 7 and its twin 900 on top: a tie
    cand, stats = head_screen.screen(x, screen, vocab=1000)
    assert cand[0, 0] == 7
    full = linear(x).float()  # the head's own logits
    ref = _coarse_reference(x, screen)
    for m in range(6):
        top = full[m].max()
        assert cand[m, 0].item() == int((full[m] == top).nonzero()[0])  # ties to the lower row
        c = cand[m]
        others = torch.ones(1000, dtype=torch.bool)
        others[c] = False
        best_coarse = ref[m, c].max()
        denom = torch.exp(full[m, c].double() - top).sum()
        denom += torch.exp(ref[m, others] - best_coarse).sum() * torch.exp(best_coarse - top)
        assert stats[m, 0].item() == pytest.approx(1 / denom.item(), rel=1e-4)


@native
def test_rows_are_the_same_whatever_the_batch() -> None:
    _, screen = _screened(n=777, k=192, seed=5)
    x = _x(5, k=192, seed=6)
    cand, stats = head_screen.screen(x, screen, vocab=777)
    for m in range(5):
        c1, s1 = head_screen.screen(x[m : m + 1], screen, vocab=777)
        assert torch.equal(c1[0], cand[m]) and torch.equal(s1[0], stats[m])


@native
def test_rows_past_the_vocabulary_are_never_chosen() -> None:
    linear, screen = _screened()
    x = _x(4, seed=9)
    full = linear(x).float()
    tokens, _ = head_screen.greedy(x, screen, vocab=500) or ([], [])
    assert tokens == full[:, :500].argmax(-1).tolist()
    # every candidate past the vocabulary (row 0 is not one): no token, the caller then
    # takes the full head
    assert 0 not in head_screen.screen(x, screen, vocab=1)[0]
    assert head_screen.greedy(x, screen, vocab=1) is None


@native
def test_the_screen_of_a_head_equals_the_packing_of_its_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    weight = quantize_int4(torch.randn(100, 128) * 0.1, 64)
    linear = Int4Linear(weight, None, torch.bfloat16)
    monkeypatch.setattr(head_screen, "_BUILD_TILES", 3)  # built 3 tiles at a time: 3 + 3 + 1
    screen = head_screen.for_head(linear)
    assert screen is not None
    dense = linear(torch.eye(128)).T  # the head's weights, as the screen reads them
    assert torch.equal(screen.codes, head_screen.pack(dense))
    assert head_screen.for_head(linear) is screen  # built once


def test_what_cannot_be_screened() -> None:
    assert head_screen.for_head(torch.nn.Linear(128, 10)) is None
    with pytest.raises(ValueError, match="groups of 64"):
        head_screen.pack(torch.zeros(10, 96))


@native
def test_bad_shapes_get_a_clear_error() -> None:
    _, screen = _screened()
    with pytest.raises(RuntimeError, match="inputs"):
        head_screen.screen(_x(1, k=64), screen, vocab=1000)
    with pytest.raises(RuntimeError, match="bf16"):
        head_screen.screen(_x(1).float(), screen, vocab=1000)


def _draft(seed: int = 0):  # type: ignore[no-untyped-def]
    model = make_tiny_model(
        "qwen2", seed=seed, vocab_size=1000, hidden_size=128, head_dim=32, intermediate_size=128
    )
    return quantize_model(model.to(torch.bfloat16), "int4")


@native
def test_the_draft_proposes_as_with_the_full_head(monkeypatch: pytest.MonkeyPatch) -> None:
    draft = _draft()
    greedy = SamplingParams()
    proposer = DraftModelProposer(draft, 1000, 6, max_model_len=128, confidence_threshold=0.0)
    assert proposer.head_screen is not None
    prompts = [[(13 * i + 5 * j) % 997 for j in range(9 + i)] for i in range(6)]
    screened = [
        proposer.propose([ProposeInput(f"r{i}", p, 5, greedy)])[0] for i, p in enumerate(prompts)
    ]
    conf_screened = proposer.last_confidences
    monkeypatch.setenv(head_screen.SWITCH, "0")
    full = DraftModelProposer(draft, 1000, 6, max_model_len=128, confidence_threshold=0.0)
    plain = [full.propose([ProposeInput(f"r{i}", p, 5, greedy)])[0] for i, p in enumerate(prompts)]
    assert [p.draft_token_ids for p in screened] == [p.draft_token_ids for p in plain]
    assert len(conf_screened[0]) == 5 and all(0 < c <= 1 for c in conf_screened[0])


@native
def test_the_switch_turns_the_screen_off(monkeypatch: pytest.MonkeyPatch) -> None:
    draft = _draft(seed=1)
    monkeypatch.setenv(head_screen.SWITCH, "0")
    assert DraftModelProposer(draft, 1000, max_model_len=64).head_screen is None
    monkeypatch.delenv(head_screen.SWITCH)
    proposer = DraftModelProposer(draft, 1000, max_model_len=64)
    assert proposer.head_screen is not None
    called = []
    real = head_screen.greedy
    monkeypatch.setattr(head_screen, "greedy", lambda *a: called.append(1) or real(*a))
    proposer.propose([ProposeInput("a", [1, 2, 3], 2, SamplingParams())])
    assert called
    called.clear()
    monkeypatch.setenv(head_screen.SWITCH, "0")  # read on every call too
    proposer.propose([ProposeInput("b", [1, 2, 3], 2, SamplingParams())])
    assert not called
