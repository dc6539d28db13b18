"""The batch-1 speculative loop: lossless greedy for every proposer and k, stop handling
inside accepted drafts, budget/context limits mid-draft, KV rollback for every acceptance
length, and sampled-mode sanity (seeded reproducibility, target-distributed tokens)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.draft_model import DraftModelProposer
from specserve.spec_decode.eagle import EagleProposer
from specserve.spec_decode.hybrid import HybridProposer
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.medusa import MedusaProposer
from specserve.spec_decode.ngram import NgramProposer
from specserve.spec_decode.plain_loop import generate_plain
from specserve.spec_decode.proposer import Proposal, ProposeInput, Proposer
from specserve.spec_decode.speculative_loop import generate_speculative, speculative_step
from specserve.spec_decode.suffix import SuffixProposer
from tests.conftest import make_tiny_model
from tests.cost_spies import spy_costs_and_catch_ups
from tests.heads import make_eagle_head, make_medusa_heads

EOS = (96,)


def make_proposer(kind: str, target: DecoderLM) -> Proposer:
    if kind == "draft-same":  # always right
        return DraftModelProposer(copy.deepcopy(target), target.cfg.vocab_size, max_model_len=256)
    if kind == "draft-random":  # mostly wrong
        draft = make_tiny_model(target.cfg.family, seed=99)
        return DraftModelProposer(draft, target.cfg.vocab_size, max_model_len=256)
    if kind == "ngram":
        return NgramProposer(1, 3)
    if kind == "suffix":
        return SuffixProposer(max_depth=8, min_match_len=1, min_confidence=0.0)
    if kind == "eagle":  # a random EAGLE-3 head over part of the vocabulary: mostly wrong
        head = make_eagle_head(target, seed=98, draft_vocab_size=target.cfg.vocab_size * 3 // 4)
        return EagleProposer(target, head)
    if kind == "medusa":  # random Medusa heads: mostly wrong
        return MedusaProposer(target, make_medusa_heads(target, seed=97, num_heads=8))
    if kind == "hybrid":  # suffix where it matches, a mostly wrong draft model elsewhere
        draft = make_tiny_model(target.cfg.family, seed=99)
        return HybridProposer(
            SuffixProposer(max_depth=8, min_match_len=1, min_confidence=0.0),
            DraftModelProposer(draft, target.cfg.vocab_size, max_model_len=256),
        )
    raise ValueError(kind)


def prompts(seed: int, n: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        base = torch.randint(0, 90, (3 + 4 * i,), generator=g).tolist()
        out.append(base * 2 if i % 2 else base)  # some repetition for the lookup proposers
    return out


@pytest.mark.parametrize("k", [1, 3, 7, 15])
@pytest.mark.parametrize(
    "kind", ["draft-same", "draft-random", "ngram", "suffix", "hybrid", "eagle", "medusa"]
)
def test_greedy_is_lossless(family: str, kind: str, k: int) -> None:
    target = make_tiny_model(family, seed=1)
    proposer = make_proposer(kind, target)
    for prompt in prompts(0, 2):
        for ignore_eos in (True, False):
            params = SamplingParams(max_tokens=20, ignore_eos=ignore_eos)
            plain = generate_plain(target, prompt, params, EOS)
            spec = generate_speculative(target, proposer, prompt, params, EOS, k)
            assert spec.token_ids == plain.token_ids
            assert spec.finish_reason == plain.finish_reason
            if kind == "draft-same":
                assert spec.stats.acceptance_rate == 1.0
    if kind == "draft-same":
        assert spec.num_target_forwards < len(spec.token_ids) - 1


@pytest.mark.parametrize("kind", ["draft-same", "draft-random", "ngram", "suffix"])
def test_adaptive_k_is_lossless(kind: str) -> None:
    target = make_tiny_model("qwen2", seed=2)
    proposer = make_proposer(kind, target)
    controller = KController(k_max=6)
    for prompt in prompts(5, 3):
        params = SamplingParams(max_tokens=40, ignore_eos=True)
        plain = generate_plain(target, prompt, params, EOS)
        spec = generate_speculative(target, proposer, prompt, params, EOS, controller)
        assert spec.token_ids == plain.token_ids
        assert all(0 <= k <= 6 for k in spec.k_history)


class ScriptedProposer:
    """Proposes the next tokens of a known continuation, wrong from position ``num_right``."""

    def __init__(self, continuation: list[int], prompt_len: int, num_right: int) -> None:
        self.continuation, self.prompt_len, self.num_right = continuation, prompt_len, num_right

    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        out = []
        for inp in batch:
            done = len(inp.token_ids) - self.prompt_len
            right = self.continuation[done : done + inp.num_draft_tokens]
            draft = [t if i < self.num_right else (t + 1) % 90 for i, t in enumerate(right)]
            out.append(Proposal(draft))
        return out

    def release(self, request_id: str) -> None:
        return None


@pytest.mark.parametrize("k", [1, 3, 7])
def test_kv_rollback_for_every_acceptance_length(k: int) -> None:
    target = make_tiny_model("llama", seed=3)
    prompt = [5, 17, 42, 8, 9]
    params = SamplingParams(max_tokens=k + 4, ignore_eos=True)
    plain = generate_plain(target, prompt, params, EOS).token_ids
    for num_right in range(k + 1):
        cache = SingleSequenceCache(target, 64)
        committed = [*prompt, plain[0]]
        cache.forward(committed[:-1])
        proposer = ScriptedProposer(plain, len(prompt), num_right)
        step = speculative_step(target, proposer, cache, committed, params, None, k, "r")
        assert step.new_tokens == plain[1 : num_right + 2]  # accepted + the target's token
        assert cache.num_tokens == len(committed) + num_right  # pointer moved, no copy
        # The rolled-back cache continues exactly like a freshly filled one.
        committed += step.new_tokens
        fresh = SingleSequenceCache(target, 64)
        fresh.forward(committed[:-1])
        got = target.compute_logits(cache.forward([committed[-1]]))
        want = target.compute_logits(fresh.forward([committed[-1]]))
        torch.testing.assert_close(got, want)


def first_new_token_index(tokens: list[int], start: int, k: int | None = None) -> int:
    """First index >= start whose token did not occur before; with ``k``, also one that an
    always-right draft of k tokens proposes (not a bonus token): steps emit tokens
    1..k+1, k+2..2k+2, ... after the prefill's token 0."""
    return next(
        j
        for j in range(start, len(tokens))
        if tokens[j] not in tokens[:j] and (k is None or (j - 1) % (k + 1) != k)
    )


@pytest.mark.parametrize("k", [3, 7])
def test_stop_token_inside_an_accepted_draft(k: int) -> None:
    target = make_tiny_model("qwen3", seed=4)
    prompt = [1, 2, 3, 4]
    plain_all = generate_plain(target, prompt, SamplingParams(max_tokens=30, ignore_eos=True), EOS)
    j = first_new_token_index(plain_all.token_ids, 3, k)
    params = SamplingParams(
        max_tokens=30, ignore_eos=True, stop_token_ids=(plain_all.token_ids[j],)
    )
    plain = generate_plain(target, prompt, params, EOS)
    spec = generate_speculative(target, make_proposer("draft-same", target), prompt, params, EOS, k)
    assert spec.token_ids == plain.token_ids == plain_all.token_ids[: j + 1]
    assert spec.finish_reason == plain.finish_reason == "stop"
    # The step that produced the stop token produced more after it; those were dropped.
    produced = 1 + spec.stats.num_accepted_tokens + spec.num_target_forwards
    assert produced > len(spec.token_ids)


def detokenize(ids: list[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


@pytest.mark.parametrize("k", [2, 7])
def test_stop_string_inside_an_accepted_draft(k: int) -> None:
    target = make_tiny_model("llama", seed=5)
    prompt = [11, 12, 13]
    free = generate_plain(target, prompt, SamplingParams(max_tokens=30, ignore_eos=True), EOS)
    j = first_new_token_index(free.token_ids, 4, k)
    # A stop string spanning tokens j-1 and j (it ends in the middle of token j's text).
    stop = f"{free.token_ids[j - 1]}><{free.token_ids[j]}"
    params = SamplingParams(max_tokens=30, ignore_eos=True, stop=(stop,))
    spec = generate_speculative(
        target, make_proposer("draft-same", target), prompt, params, EOS, k, detokenize=detokenize
    )
    assert spec.token_ids == free.token_ids[: j + 1]
    assert spec.finish_reason == "stop"
    assert spec.text == detokenize(free.token_ids[: j - 1]) + "<"
    with pytest.raises(ValueError, match="detokenize"):
        generate_speculative(target, NgramProposer(), prompt, params, EOS, k)


@pytest.mark.parametrize("kind", ["draft-same", "ngram"])
def test_max_tokens_and_context_limit_mid_draft(kind: str) -> None:
    target = make_tiny_model("qwen2", seed=6)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    for max_tokens, max_model_len in ((5, None), (1, None), (2, None), (50, len(prompt) + 6)):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        plain = generate_plain(target, prompt, params, EOS, max_model_len)
        spec = generate_speculative(
            target, make_proposer(kind, target), prompt, params, EOS, 15, max_model_len
        )
        assert spec.token_ids == plain.token_ids
        assert len(spec.token_ids) == min(max_tokens, 6 if max_model_len else max_tokens)
        assert spec.finish_reason == "length"
        # k is capped by the remaining budget: k drafts + 1 bonus token never overshoot.
        assert all(k <= len(spec.token_ids) - 1 for k in spec.k_history)


class EmptyProposer:
    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        return [Proposal([]) for _ in batch]

    def release(self, request_id: str) -> None:
        return None


def test_empty_drafts_and_k0_are_plain_steps() -> None:
    target = make_tiny_model("llama", seed=7)
    prompt = [3, 1, 4, 1, 5]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    plain = generate_plain(target, prompt, params, EOS)
    for proposer, k in ((EmptyProposer(), 4), (make_proposer("draft-same", target), 0)):
        spec = generate_speculative(target, proposer, prompt, params, EOS, k)
        assert spec.token_ids == plain.token_ids
        assert spec.num_target_forwards == plain.num_target_forwards
        assert spec.stats.num_drafts == 0
    with pytest.raises(ValueError):
        generate_speculative(target, EmptyProposer(), [], params, EOS, 2)
    with pytest.raises(ValueError):
        generate_speculative(target, EmptyProposer(), prompt, params, EOS, -1)


def test_sampled_is_seed_reproducible_and_identical_draft_is_accepted() -> None:
    target = make_tiny_model("qwen2", seed=8)
    prompt = [2, 7, 1, 8, 2, 8]
    params = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True, seed=123)
    runs = [
        generate_speculative(target, make_proposer("draft-same", target), prompt, params, EOS, 4)
        for _ in range(2)
    ]
    assert runs[0].token_ids == runs[1].token_ids
    # Draft == target: p_target / p_draft == 1 up to rounding, so (nearly) every draft passes.
    assert runs[0].stats.acceptance_rate > 0.95
    other = generate_speculative(
        target,
        make_proposer("draft-random", target),
        prompt,
        SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True, seed=124),
        EOS,
        4,
    )
    assert other.token_ids != runs[0].token_ids


@pytest.mark.parametrize("kind", ["draft-random", "ngram", "eagle", "medusa"])
def test_sampled_step_follows_the_target_distribution(kind: str) -> None:
    """The token produced by a verify step (accepted draft or recovered) is distributed as the
    target's next-token distribution, marginalised over the first sampled token."""
    target = make_tiny_model("llama", seed=9, vocab_size=8, eos_token_ids=())
    prompt = [1, 2, 3, 1, 2]
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    with torch.inference_mode():
        cache = SingleSequenceCache(target, 16)
        p0 = torch.softmax(target.compute_logits(cache.forward(prompt))[-1], -1)  # [8]
        p1 = torch.zeros(8)
        for t0 in range(8):
            cache.truncate(len(prompt))
            p1 += p0[t0] * torch.softmax(target.compute_logits(cache.forward([t0]))[-1], -1)
    proposer = make_proposer(kind, target)
    torch.manual_seed(0)
    n = 800
    counts = torch.zeros(8)
    drafted = 0
    for _ in range(n):
        res = generate_speculative(target, proposer, prompt, params, (), 1)
        counts[res.token_ids[1]] += 1
        drafted += res.stats.num_drafts
    assert drafted > n // 8  # the draft path really ran
    expected = p1 * n
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < 30.0, (stat, counts.tolist(), expected.tolist())  # chi2(7) 1e-4 tail ~ 29.9


def test_greedy_is_lossless_over_many_seeds() -> None:
    """Many random targets, drafts and prompts at k = 3 (the grid above covers every k)."""
    for seed in range(12):
        target = make_tiny_model(["llama", "qwen2", "qwen3"][seed % 3], seed=100 + seed)
        draft = make_tiny_model(target.cfg.family, seed=200 + seed)
        proposer = DraftModelProposer(draft, target.cfg.vocab_size, max_model_len=256)
        prompt = torch.randint(0, 96, (2 + seed,), generator=torch.Generator().manual_seed(seed))
        params = SamplingParams(max_tokens=20, ignore_eos=seed % 2 == 0)
        plain = generate_plain(target, prompt.tolist(), params, EOS)
        spec = generate_speculative(target, proposer, prompt.tolist(), params, EOS, 3)
        assert spec.token_ids == plain.token_ids


def test_loop_does_not_learn_draft_cost_from_a_catch_up_burst() -> None:
    """As in the engine: after k = 0 steps the draft model's next propose call first catches
    up every token it missed, a one-off burst; the loop records that step's verify cost but
    no draft cost, and records steady calls (catch-up of at most 2 tokens) in full. Before,
    the loop charged a probe's 17-token catch-up to its 2 drafts, so a fresh controller
    thought a draft token cost a whole target step and stopped drafting for good."""
    target = make_tiny_model("qwen2", seed=2)
    proposer = DraftModelProposer(copy.deepcopy(target), target.cfg.vocab_size, max_model_len=256)
    controller = KController(k_max=4)
    ks = iter([0, 0, 0, 0, 0, 3, 3, 3, 3, 3])
    controller.choose_k = lambda request_id, batch_size=1: next(ks, 3)  # type: ignore[method-assign]
    recorded, catch_ups = spy_costs_and_catch_ups(controller, proposer)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompt = prompts(1, 5)[0]
    spec = generate_speculative(target, proposer, prompt, params, EOS, controller)
    assert spec.token_ids == generate_plain(target, prompt, params, EOS).token_ids
    assert catch_ups[0] > 2 and all(c <= 2 for c in catch_ups[1:]), catch_ups
    drafted = [r for r in recorded if r[2] > 1]  # steps that verified drafts
    assert drafted[0] == (0.0, 0, 4)  # the burst: verify cost recorded, no draft cost
    assert all(d > 0.0 and n == v - 1 > 0 for d, n, v in drafted[1:]), drafted
    assert controller.costs.draft_per_token  # learnt from the steady calls only


def test_generate_reports_the_k_history_in_runs() -> None:
    from specserve.commands.generate import run_lengths

    assert run_lengths([]) == ""
    assert run_lengths([4]) == "4"
    assert run_lengths([0, 1, 0, 0, 0, 2, 2, 1]) == "0 1 0x3 2x2 1"
