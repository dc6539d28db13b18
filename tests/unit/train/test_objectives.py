"""The training objectives compute what serving computes: EAGLE-3's training-time-test
steps give, row for row, the logits the proposer's drafting steps give; Medusa's loss scores
head i on token p + 2 + i."""

from __future__ import annotations

import torch

from specserve.models.eagle3 import Eagle3Head
from specserve.train.objectives import StepScores, eagle3_loss, medusa_loss
from tests.conftest import make_tiny_model
from tests.heads import make_eagle_head, make_medusa_heads


def _setup() -> tuple[torch.nn.Module, Eagle3Head, torch.Tensor, torch.Tensor, torch.Tensor]:
    target = make_tiny_model("llama", seed=11)
    head = make_eagle_head(target, seed=12, draft_vocab_size=97).float().requires_grad_(True)
    tokens = torch.tensor([5, 17, 3, 9, 22, 4, 61, 8, 13, 2, 70, 33])
    hidden = torch.randn(len(tokens) - 1, 3 * 64, generator=torch.Generator().manual_seed(0))
    t2d = torch.arange(97)
    return target.model.embed_tokens, head, tokens, hidden, t2d


def test_training_steps_equal_the_drafting_steps() -> None:
    embed, head, tokens, hidden, t2d = _setup()
    n = len(hidden)
    captured: list[torch.Tensor] = []
    orig = head.lm_head.forward

    def spy(x: torch.Tensor) -> torch.Tensor:  # the scored rows' logits of each step
        out = orig(x)
        captured.append(out.detach())
        return out

    head.lm_head.forward = spy  # type: ignore[method-assign]
    with torch.no_grad():
        eagle3_loss(head, embed, tokens, hidden, 0, t2d, ttt_steps=2)
    head.lm_head.forward = orig  # type: ignore[method-assign]
    step0, step1 = captured  # rows 0..n-3 (step 0), rows 1..n-3 (step 1)
    with torch.no_grad():
        for p in range(1, n - 1):
            # serving: real context 0..p-1 caught up, then draft 2 at position p
            cache = head.new_cache(0)
            emb = embed(tokens[1 : p + 1][None])
            logits, out = head(emb, head.combine(hidden[:p])[None], torch.arange(p)[None], cache)
            assert torch.allclose(logits[0, -1], step0[p - 1], atol=1e-4)
            logits2, _ = head(embed(tokens[p + 1 : p + 2][None]), out[:, -1:],
                              torch.tensor([[p]]), cache)  # fmt: skip
            assert torch.allclose(logits2[0, -1], step1[p - 1], atol=1e-4)


def test_loss_scores_only_reply_tokens_in_the_draft_vocabulary() -> None:
    embed, head, tokens, hidden, t2d = _setup()
    loss, scores = eagle3_loss(head, embed, tokens, hidden, prompt_len=6, target_to_draft=t2d,
                               ttt_steps=3)  # fmt: skip
    assert loss.requires_grad
    # labels are tokens 6..11 (rows p = 4..9); step s drops rows p < s (none here)
    assert scores.scored == [6, 6, 6]
    outside = t2d.clone()
    outside[tokens[8]] = -100
    _, fewer = eagle3_loss(head, embed, tokens, hidden, 6, outside, 1)
    assert fewer.scored == [5]


def test_given_targets_are_scored_in_place_of_the_tokens() -> None:
    """A given reply is scored on the target's own tokens: the loss with ``targets`` equals
    the loss of a sequence whose tokens are those targets where only the labels change."""
    embed, head, tokens, hidden, t2d = _setup()
    targets = tokens.clone()
    targets[7:] = torch.tensor([1, 2, 3, 4, 5])
    with_targets, scores = eagle3_loss(head, embed, tokens, hidden, 6, t2d, 2, targets=targets)
    plain, _ = eagle3_loss(head, embed, tokens, hidden, 6, t2d, 2)
    assert scores.scored == [6, 6] and not torch.allclose(with_targets, plain)
    outside = t2d.clone()
    outside[3] = -100  # targets[9]: a label now, tokens[9] is not
    _, fewer = eagle3_loss(head, embed, tokens, hidden, 6, outside, 1, targets=targets)
    assert fewer.scored == [5]
    target = make_tiny_model("qwen2", seed=1)
    heads = make_medusa_heads(target, seed=2, num_heads=2).float()
    lm = target.lm_head.weight
    same = medusa_loss(heads, lm, tokens, hidden[:, :64], 6, t2d, targets=tokens)[0]
    assert torch.equal(same, medusa_loss(heads, lm, tokens, hidden[:, :64], 6, t2d)[0])
    other = medusa_loss(heads, lm, tokens, hidden[:, :64], 6, t2d, targets=targets)[0]
    assert not torch.equal(same, other)


def test_medusa_head_i_is_scored_on_token_p_plus_2_plus_i() -> None:
    target = make_tiny_model("qwen2", seed=1)
    heads = make_medusa_heads(target, seed=2, num_heads=3).float().requires_grad_(True)
    tokens = torch.arange(10, 22)
    hidden = torch.randn(11, 64)
    lm = target.lm_head.weight
    loss, scores = medusa_loss(heads, lm, tokens, hidden, 4, torch.arange(97))
    assert scores.scored == [8, 8, 8]  # head i: rows p with 4 <= p + 2 + i <= 11
    loss.backward()
    assert all(p.grad is not None for p in heads.parameters())


def test_expected_accepted_is_the_sum_of_running_products() -> None:
    s = StepScores([10, 10, 10], [8, 5, 0])
    assert abs(s.expected_accepted() - (0.8 + 0.8 * 0.5)) < 1e-9
