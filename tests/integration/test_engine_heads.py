"""EAGLE-3 and Medusa in the batched engine: greedy fp32 output equals plain generation for
every k (fixed and adaptive), with staggered arrivals, preemption and prefix-cache hits; the
hidden states the engine records for training equal a single forward over the sequence."""

from __future__ import annotations

import random

import pytest
import torch

from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.engine.builder import build_engine_from_models
from specserve.engine.llm_engine import LLMEngine
from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model
from tests.heads import make_eagle_head, make_medusa_heads
from tests.integration.test_engine_plain import run_staggered, tokens_of
from tests.integration.test_engine_spec import assert_equals_plain

VOCAB = 13


def make_engine(
    target: DecoderLM,
    method: str,
    k: int | None,
    num_blocks: int = 120,
    prefix_caching: bool = True,
) -> LLMEngine:
    head = (
        make_eagle_head(target, seed=3, draft_vocab_size=10)
        if method == "eagle"
        else make_medusa_heads(target, seed=3, num_heads=5)
    )
    config = EngineConfig(
        model=ModelConfig("tiny"),
        cache=CacheConfig(
            block_size=4, num_blocks=num_blocks, enable_prefix_caching=prefix_caching
        ),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32),
        spec=SpecConfig(method=method, num_speculative_tokens=k, k_max=7, draft_model="head"),  # type: ignore[arg-type]
    )
    return build_engine_from_models(config, target, head=head, head_name="head")


@pytest.mark.parametrize("k", [1, 3, 7, None])
@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_head_speculation_equals_plain(method: str, k: int | None) -> None:
    target = make_tiny_model("qwen3", vocab_size=VOCAB)
    engine = make_engine(target, method, k)
    assert target.capture_layers == engine.proposer.target_hidden_layers  # type: ignore[union-attr]
    assert_equals_plain(engine, target, seed=1)
    stats = engine.stats()
    assert stats.spec.num_drafts > 0
    if k is not None:  # (adaptive k soon stops drafting for a random head)
        assert stats.spec.num_accepted_tokens > 0


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_preemption_and_prefix_hits_keep_the_output(method: str) -> None:
    target = make_tiny_model("qwen2", vocab_size=VOCAB)
    engine = make_engine(target, method, 3, num_blocks=13)
    rng = random.Random(5)
    shared = [rng.randrange(VOCAB - 1) for _ in range(8)]  # a common prefix: cache hits
    prompts = {f"r{i}": shared + [rng.randrange(VOCAB - 1) for _ in range(4)] for i in range(4)}
    params = {rid: SamplingParams(max_tokens=30, ignore_eos=True) for rid in prompts}
    outs = run_staggered(engine, prompts, params, {rid: 2 * i for i, rid in enumerate(prompts)})
    assert engine.stats().num_preemptions > 0
    for rid, prompt in prompts.items():
        ref = generate_plain(target, prompt, params[rid], target.cfg.eos_token_ids)
        assert tokens_of(outs[rid]) == ref.token_ids, rid
    engine.kv.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0


def test_recorded_hidden_states_equal_one_forward_over_the_sequence() -> None:
    target = make_tiny_model("llama", vocab_size=VOCAB)
    config = EngineConfig(
        model=ModelConfig("tiny"),
        cache=CacheConfig(block_size=4, num_blocks=200, enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=16),
    )
    engine = build_engine_from_models(config, target)
    layers = (1, 0, target.cfg.num_layers)
    engine.record_hidden(layers)
    rng = random.Random(2)
    prompts = {f"r{i}": [rng.randrange(VOCAB - 1) for _ in range(rng.randint(3, 20))]
               for i in range(5)}  # fmt: skip
    params = {rid: SamplingParams(max_tokens=12, ignore_eos=True) for rid in prompts}
    outs = run_staggered(engine, prompts, params, {rid: i for i, rid in enumerate(prompts)})
    for rid, prompt in prompts.items():
        last = outs[rid][-1]
        assert last.finished and last.hidden_states is not None
        seq = prompt + tokens_of(outs[rid])
        assert last.hidden_states.shape == (len(seq) - 1, 3 * target.cfg.hidden_size)
        assert all(o.hidden_states is None for o in outs[rid][:-1])
        target.capture_layers = layers
        cache = SingleSequenceCache(target, len(seq))
        with torch.inference_mode():
            cache.forward(seq[:-1])
        assert cache.last_captured is not None
        assert torch.allclose(last.hidden_states, cache.last_captured, atol=1e-5)
    with pytest.raises(ValueError):
        engine.record_hidden(())
