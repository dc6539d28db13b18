"""Speculative continuous batching is lossless: greedy fp32 output equals plain generation for
every method (n-gram, suffix, draft model, hybrid) and k, with staggered arrivals, preemption and
adaptive k; the acceptance counters add up."""

from __future__ import annotations

import random

import pytest
import torch

from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.engine.builder import build_engine_from_models
from specserve.engine.llm_engine import LLMEngine
from specserve.models.decoder import DecoderLM
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model
from tests.cost_spies import spy_costs_and_catch_ups
from tests.integration.test_engine_plain import run_staggered, tokens_of

VOCAB = 13  # a small vocabulary makes n-gram / suffix matches (and acceptances) common


def make_engine(
    target: DecoderLM,
    method: str,
    k: int | None,
    draft: DecoderLM | None = None,
    num_blocks: int = 120,
    max_num_seqs: int = 4,
    confidence_threshold: float = 0.0,
    head: torch.nn.Module | None = None,
    device: str = "cpu",
) -> LLMEngine:
    """An engine over ``target`` (and ``draft`` or a trained ``head``), all on ``device``."""
    config = EngineConfig(
        model=ModelConfig("tiny", device=device),
        cache=CacheConfig(block_size=4, num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=32),
        spec=SpecConfig(
            method=method,  # type: ignore[arg-type]
            num_speculative_tokens=k,
            k_max=7,
            ngram_min=1,
            ngram_max=3,
            draft_model="tiny-draft" if method in ("draft", "hybrid", "eagle", "medusa") else None,
            draft_confidence_threshold=confidence_threshold,
        ),
    )
    return build_engine_from_models(config, target, draft=draft, head=head, head_name="head")


def prompts_and_params(n: int, seed: int) -> tuple[dict[str, list[int]], dict[str, SamplingParams]]:
    rng = random.Random(seed)
    prompts = {
        f"r{i}": [rng.randrange(VOCAB - 1) for _ in range(rng.randint(2, 30))] for i in range(n)
    }
    params = {rid: SamplingParams(max_tokens=rng.randint(6, 20)) for rid in prompts}
    return prompts, params


def assert_equals_plain(engine: LLMEngine, target: DecoderLM, n: int = 5, seed: int = 0) -> None:
    prompts, params = prompts_and_params(n, seed)
    outs = run_staggered(engine, prompts, params, {rid: i for i, rid in enumerate(prompts)})
    for rid, prompt in prompts.items():
        ref = generate_plain(target, prompt, params[rid], target.cfg.eos_token_ids)
        assert tokens_of(outs[rid]) == ref.token_ids, rid
        assert outs[rid][-1].finish_reason == ref.finish_reason
    engine.kv.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0
    stats = engine.stats()
    per_request = [outs[rid][-1].spec for rid in prompts]
    assert all(s is not None for s in per_request)
    assert sum(s.num_draft_tokens for s in per_request if s) == stats.spec.num_draft_tokens
    assert sum(stats.spec.num_accepted_tokens_per_pos) == stats.spec.num_accepted_tokens


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("method", ["ngram", "suffix", "draft", "hybrid"])
def test_speculative_batch_equals_plain(method: str, k: int) -> None:
    target = make_tiny_model("qwen3", vocab_size=VOCAB)
    draft = (
        make_tiny_model("qwen3", seed=1, vocab_size=VOCAB)
        if method in ("draft", "hybrid")
        else None
    )
    engine = make_engine(target, method, k, draft)
    assert_equals_plain(engine, target)
    assert engine.stats().spec.num_drafts > 0


def test_draft_equal_to_target_accepts_everything() -> None:
    target = make_tiny_model("llama", vocab_size=VOCAB)
    engine = make_engine(target, "draft", 3, draft=target)
    prompts, params = prompts_and_params(3, seed=1)
    params = {rid: SamplingParams(max_tokens=13, ignore_eos=True) for rid in prompts}
    run_staggered(engine, prompts, params, {rid: 0 for rid in prompts})
    spec = engine.stats().spec
    assert spec.num_drafts > 0 and spec.num_accepted_tokens == spec.num_draft_tokens
    assert spec.mean_acceptance_length == pytest.approx(4.0)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_adaptive_k_equals_plain(method: str) -> None:
    target = make_tiny_model("llama", vocab_size=VOCAB)
    draft = make_tiny_model("llama", seed=3, vocab_size=VOCAB) if method == "draft" else None
    engine = make_engine(target, method, None, draft)
    assert_equals_plain(engine, target, seed=2)
    assert sum(engine.stats().k_chosen_counts.values()) > 0


@pytest.mark.parametrize("k", [7, None])
@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_confidence_stop_equals_plain(method: str, k: int | None) -> None:
    """Drafts cut short by the draft's confidence stop, fixed or adaptive k: still plain."""
    target = make_tiny_model("qwen2", vocab_size=VOCAB)
    draft = make_tiny_model("qwen2", seed=4, vocab_size=VOCAB)
    engine = make_engine(target, method, k, draft, confidence_threshold=0.35)
    assert engine.k_controller is not None
    assert engine.k_controller.confidence_stop
    assert_equals_plain(engine, target, n=6, seed=3)
    spec = engine.stats().spec
    assert spec.num_drafts > 0
    if k is not None:  # some drafts stopped before k
        assert spec.num_draft_tokens < k * spec.num_drafts


def test_preemption_then_recompute_gives_identical_output() -> None:
    target = make_tiny_model("qwen2", vocab_size=VOCAB)
    # 12 usable blocks of 4 slots cannot hold 4 requests of up to 50 tokens: preemptions.
    engine = make_engine(target, "ngram", 3, num_blocks=13)
    rng = random.Random(5)
    prompts = {f"r{i}": [rng.randrange(VOCAB - 1) for _ in range(12)] for i in range(4)}
    params = {rid: SamplingParams(max_tokens=30, ignore_eos=True) for rid in prompts}
    outs = run_staggered(engine, prompts, params, {rid: 0 for rid in prompts})
    assert engine.stats().num_preemptions > 0
    assert any(outs[rid][-1].num_preemptions > 0 for rid in prompts)
    for rid, prompt in prompts.items():
        ref = generate_plain(target, prompt, params[rid], target.cfg.eos_token_ids)
        assert tokens_of(outs[rid]) == ref.token_ids, rid
    engine.kv.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0


def test_abort_mid_speculation_frees_everything() -> None:
    target = make_tiny_model("llama", vocab_size=VOCAB)
    engine = make_engine(target, "draft", 5, draft=make_tiny_model("llama", 2, vocab_size=VOCAB))
    for i in range(3):
        engine.add_request(
            f"r{i}", [1, 2, 3, 4, 5, 6, 7], SamplingParams(max_tokens=100, ignore_eos=True)
        )
    for _ in range(4):
        engine.step()
    assert engine.kv.pool.num_used_blocks > 0
    for i in range(3):
        out = engine.abort_request(f"r{i}")
        assert out is not None and out.finished and out.finish_reason == "abort"
    assert engine.abort_request("r0") is None
    assert not engine.has_unfinished_requests()
    engine.kv.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0
    assert engine.step() == []


def test_seeded_sampling_with_speculation_independent_of_batch() -> None:
    target = make_tiny_model("llama", vocab_size=VOCAB)
    draft = make_tiny_model("llama", seed=4, vocab_size=VOCAB)
    prompts, _ = prompts_and_params(4, seed=6)
    params = {
        rid: SamplingParams(temperature=0.9, seed=10 + i, max_tokens=15, ignore_eos=True)
        for i, rid in enumerate(prompts)
    }
    alone = {}
    for rid in prompts:
        engine = make_engine(target, "draft", 3, draft)
        alone[rid] = tokens_of(run_staggered(engine, {rid: prompts[rid]}, params, {rid: 0})[rid])
    engine = make_engine(target, "draft", 3, draft)
    together = run_staggered(engine, prompts, params, {rid: i for i, rid in enumerate(prompts)})
    assert {rid: tokens_of(o) for rid, o in together.items()} == alone
    assert engine.stats().spec.num_drafts > 0


def test_k_controller_sees_batch_size_and_measured_costs() -> None:
    target = make_tiny_model("llama", vocab_size=VOCAB)
    engine = make_engine(target, "ngram", None)
    controller = engine.k_controller
    assert controller is not None
    seen: list[int] = []
    choose = controller.choose_k

    def spy(request_id: str, batch_size: int = 1) -> int:
        seen.append(batch_size)
        return choose(request_id, batch_size)

    controller.choose_k = spy  # type: ignore[method-assign]
    prompts, _ = prompts_and_params(3, seed=8)
    params = {rid: SamplingParams(max_tokens=12, ignore_eos=True) for rid in prompts}
    run_staggered(engine, prompts, params, {rid: 0 for rid in prompts})
    assert 3 in seen  # all three decoding together
    # Pure decode steps were timed and reported per batch size.
    assert any(b == 3 for b, _ in controller.costs.verify_by_shape)


def test_draft_cost_is_not_learned_from_a_catch_up_burst() -> None:
    """After steps with k = 0 the draft's lane is behind and its next propose call first
    catches up every committed token it missed; that call's time is a one-off burst, so the
    engine does not hand it to the controller as the per-token draft cost (it still records
    the verify cost). Steady calls (catch-up of at most 2 tokens) are recorded."""
    target = make_tiny_model("llama", vocab_size=VOCAB)
    draft = make_tiny_model("llama", vocab_size=VOCAB, seed=1)
    engine = make_engine(target, "draft", None, draft)
    controller, proposer = engine.k_controller, engine.proposer
    assert controller is not None and proposer is not None
    ks = iter([0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 3])
    controller.choose_k = lambda request_id, batch_size=1: next(ks, 3)  # type: ignore[method-assign]
    recorded, catch_ups = spy_costs_and_catch_ups(controller, proposer)
    params = {"r": SamplingParams(max_tokens=24, ignore_eos=True)}
    run_staggered(engine, {"r": [1, 2, 3, 4, 5]}, params, {"r": 0})
    assert catch_ups[0] > 2 and all(c <= 2 for c in catch_ups[1:]), catch_ups
    drafted = [(n, v) for _, n, v in recorded if v > 1]  # steps that verified a draft
    assert drafted[0] == (0, 4)  # the burst: verify recorded, no draft cost
    assert all(n == v - 1 > 0 for n, v in drafted[1:])


def test_draft_model_runs_each_prompt_in_the_step_that_completes_it() -> None:
    """The draft's pass over a prompt runs in the step that samples the prompt's first token
    (after the last of its chunks), once per request, so the first propose call catches up
    one token; the output still equals plain decoding."""
    target = make_tiny_model("llama", vocab_size=VOCAB)
    draft = make_tiny_model("llama", vocab_size=VOCAB, seed=1)
    engine = make_engine(target, "draft", 3, draft)
    proposer = engine.proposer
    assert proposer is not None
    prefilled: list[tuple[str, int, int]] = []  # request, prompt tokens, its output so far
    prefill = proposer.prefill  # type: ignore[attr-defined]

    def spy(request_id: str, prompt_ids: list[int], max_tokens: int | None = None) -> int:
        prefilled.append(
            (request_id, len(prompt_ids), engine.requests[request_id].num_output_tokens)
        )
        return prefill(request_id, prompt_ids, max_tokens)

    proposer.prefill = spy  # type: ignore[attr-defined]
    _, catch_ups = spy_costs_and_catch_ups(engine.k_controller, proposer)  # type: ignore[arg-type]
    rng = random.Random(3)
    prompts = {"long": [rng.randrange(VOCAB - 1) for _ in range(45)], "short": [1, 2, 3]}
    params = {rid: SamplingParams(max_tokens=10, ignore_eos=True) for rid in prompts}
    outs = run_staggered(engine, prompts, params, {"long": 0, "short": 1})  # 45 > 32 a step
    assert sorted(prefilled) == [("long", 45, 1), ("short", 3, 1)]
    assert all(c == 1 for c in catch_ups), catch_ups
    for rid, prompt in prompts.items():
        ref = generate_plain(target, prompt, params[rid], target.cfg.eos_token_ids)
        assert tokens_of(outs[rid]) == ref.token_ids, rid


def test_an_adaptive_hybrid_engine_weighs_its_measured_costs() -> None:
    """The engine links the k controller to the hybrid's draft-cost share and reports each
    decode step's verify time to it, which the hybrid's choice then weighs; output stays
    plain decoding's."""
    target = make_tiny_model("qwen3", vocab_size=VOCAB)
    engine = make_engine(target, "hybrid", None, make_tiny_model("qwen3", seed=1, vocab_size=VOCAB))
    hybrid = engine.proposer
    assert engine.k_controller is not None
    assert engine.k_controller.draft_cost_scale == getattr(hybrid, "draft_cost_scale", None)
    assert_equals_plain(engine, target)
    assert getattr(hybrid, "verify_s", None) is not None and hybrid.verify_s > 0  # type: ignore[union-attr]
