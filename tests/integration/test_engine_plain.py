"""Continuous batching without speculation equals batch-1 plain generation (fp32, greedy)."""

from __future__ import annotations

import random

import pytest

from specserve.config import CacheConfig, SchedulerConfig
from specserve.engine.llm_engine import LLMEngine
from specserve.engine.outputs import RequestOutput
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model


def run_staggered(
    engine: LLMEngine,
    prompts: dict[str, list[int]],
    params: dict[str, SamplingParams],
    arrive_at: dict[str, int],
    max_steps: int = 2000,
) -> dict[str, list[RequestOutput]]:
    """Add each request at its step number, step until everything finished."""
    outs: dict[str, list[RequestOutput]] = {rid: [] for rid in prompts}
    for step in range(max_steps):
        for rid, at in arrive_at.items():
            if at == step:
                engine.add_request(rid, prompts[rid], params[rid])
        for o in engine.step():
            outs[o.request_id].append(o)
        if step > max(arrive_at.values()) and not engine.has_unfinished_requests():
            return outs
    raise AssertionError("engine did not finish")


def tokens_of(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def random_prompts(n: int, vocab: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {
        f"r{i}": [rng.randrange(vocab - 1) for _ in range(rng.randint(1, 40))] for i in range(n)
    }


@pytest.mark.parametrize("max_batched", [16, 64])
def test_staggered_batch_equals_plain(family: str, max_batched: int) -> None:
    model = make_tiny_model(family)
    engine = LLMEngine(
        model,
        cache=CacheConfig(block_size=4, num_blocks=200),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=max_batched),
    )
    prompts = random_prompts(7, model.cfg.vocab_size, seed=1)
    params = {rid: SamplingParams(max_tokens=5 + 3 * i) for i, rid in enumerate(prompts)}
    arrive = {rid: 2 * i for i, rid in enumerate(prompts)}
    outs = run_staggered(engine, prompts, params, arrive)
    for rid, prompt in prompts.items():
        ref = generate_plain(model, prompt, params[rid], model.cfg.eos_token_ids)
        assert tokens_of(outs[rid]) == ref.token_ids, rid
        assert outs[rid][-1].finished and outs[rid][-1].finish_reason == ref.finish_reason
        assert sum(o.finished for o in outs[rid]) == 1
    engine.kv.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0


def test_seeded_sampling_independent_of_batch() -> None:
    model = make_tiny_model("llama")
    prompts = random_prompts(4, model.cfg.vocab_size, seed=2)
    params = {
        rid: SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=12)
        for i, rid in enumerate(prompts)
    }
    alone = {}
    for rid in prompts:
        eng = LLMEngine(model, cache=CacheConfig(block_size=4, num_blocks=64))
        alone[rid] = tokens_of(run_staggered(eng, {rid: prompts[rid]}, params, {rid: 0})[rid])
    eng = LLMEngine(model, cache=CacheConfig(block_size=4, num_blocks=64))
    together = run_staggered(eng, prompts, params, {rid: i for i, rid in enumerate(prompts)})
    assert {rid: tokens_of(o) for rid, o in together.items()} == alone


def test_stop_token_ids_and_min_tokens_masking() -> None:
    model = make_tiny_model("llama")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = generate_plain(model, prompt, SamplingParams(max_tokens=8, ignore_eos=True), ())
    engine = LLMEngine(model, cache=CacheConfig(block_size=4, num_blocks=32))
    # A stop id ends generation at its first occurrence, which is counted like EOS.
    stop = ref.token_ids[2]
    first = ref.token_ids.index(stop)
    p = {"s": SamplingParams(max_tokens=8, stop_token_ids=(stop,))}
    outs = run_staggered(engine, {"s": prompt}, p, {"s": 0})["s"]
    assert tokens_of(outs) == ref.token_ids[: first + 1]
    assert outs[-1].finish_reason == "stop"
    # Before min_tokens the stop id's logit is masked: it is never emitted, the argmax of the
    # remaining vocabulary is taken instead.
    p = {"m": SamplingParams(max_tokens=8, min_tokens=8, stop_token_ids=(ref.token_ids[0],))}
    toks = tokens_of(run_staggered(engine, {"m": prompt}, p, {"m": 0})["m"])
    assert len(toks) == 8 and ref.token_ids[0] not in toks
    engine.kv.check_invariants()


def test_prefix_cache_hits_give_identical_output() -> None:
    model = make_tiny_model("qwen3")
    engine = LLMEngine(model, cache=CacheConfig(block_size=4, num_blocks=64))
    shared = [(5 * i + 3) % 90 for i in range(21)]
    prompts = {"a": shared, "b": [*shared[:17], 7, 8], "c": shared}
    params = {rid: SamplingParams(max_tokens=6) for rid in prompts}
    outs = run_staggered(engine, prompts, params, {"a": 0, "b": 3, "c": 12})
    stats = engine.stats()
    # b reuses a's first 4 full blocks; c all 5 of a's (it must recompute only the last token).
    assert stats.prefix_cache_hits == 4 + 5
    for rid, prompt in prompts.items():
        ref = generate_plain(model, prompt, params[rid], model.cfg.eos_token_ids)
        assert tokens_of(outs[rid]) == ref.token_ids, rid
    engine.kv.check_invariants()
