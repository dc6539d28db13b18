"""The engine on a real model (SmolLM2-135M-Instruct, fp32): batched greedy output equals
plain generation, with and without speculation; streamed text equals the decoded tokens; stop
strings cut the text; min_tokens suppresses EOS."""

from __future__ import annotations

import pytest
import torch

from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.engine.builder import build_engine_from_models
from specserve.engine.llm_engine import LLMEngine
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from tests.integration.test_engine_plain import run_staggered, tokens_of

pytestmark = pytest.mark.slow

QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Repeat the following line 3 times: the cat sat on the mat.",
    "What is the capital of France?",
]


@pytest.fixture(scope="module")
def smollm():  # type: ignore[no-untyped-def]
    loading = pytest.importorskip("specserve.loading")
    try:
        return loading.load_model("smollm2-135m-instruct", dtype=torch.float32, device="cpu")
    except Exception as e:  # no cached model and no package index: nothing to test against
        pytest.skip(f"SmolLM2-135M not available: {e}")


def chat_ids(lm, question: str) -> list[int]:  # type: ignore[no-untyped-def]
    text = lm.tokenizer.apply_chat_template([{"role": "user", "content": question}])
    return list(lm.tokenizer.encode(text, add_special_tokens=False))


def make_engine(lm, method: str = "none", k: int | None = None) -> LLMEngine:  # type: ignore[no-untyped-def]
    config = EngineConfig(
        model=ModelConfig("smollm2-135m-instruct", max_model_len=1024),
        cache=CacheConfig(block_size=16, num_blocks=64),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),
        spec=SpecConfig(method=method, num_speculative_tokens=k),  # type: ignore[arg-type]
    )
    return build_engine_from_models(config, lm.model, lm.tokenizer, model_name=lm.name)


@pytest.mark.parametrize(("method", "k"), [("none", None), ("ngram", 3)])
def test_batched_equals_plain_and_text_matches(smollm, method: str, k: int | None) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(smollm, method, k)
    prompts = {f"q{i}": chat_ids(smollm, q) for i, q in enumerate(QUESTIONS)}
    params = {rid: SamplingParams(max_tokens=16) for rid in prompts}
    outs = run_staggered(engine, prompts, params, {rid: i for i, rid in enumerate(prompts)})
    eos = tuple(smollm.tokenizer.eos_token_ids)
    for rid, prompt in prompts.items():
        ref = generate_plain(smollm.model, prompt, params[rid], eos)
        assert tokens_of(outs[rid]) == ref.token_ids, rid
        text = "".join(o.text_delta for o in outs[rid])
        assert text == smollm.tokenizer.decode(ref.token_ids, skip_special_tokens=True)
    assert engine.kv.pool.num_used_blocks == 0


def test_stop_string_and_min_tokens(smollm) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(smollm)
    prompt = chat_ids(smollm, QUESTIONS[1])
    full = generate_plain(smollm.model, prompt, SamplingParams(max_tokens=40), (2,))
    full_text = smollm.tokenizer.decode(full.token_ids, skip_special_tokens=True)
    assert "mat" in full_text
    stop_params = {"s": SamplingParams(max_tokens=40, stop=("mat",))}
    outs = run_staggered(engine, {"s": prompt}, stop_params, {"s": 0})["s"]
    text = "".join(o.text_delta for o in outs)
    assert text == full_text[: full_text.index("mat")]
    assert outs[-1].finish_reason == "stop"
    # EOS is masked until min_tokens: the answer must run past where it would have ended.
    capital = chat_ids(smollm, QUESTIONS[2])
    short = generate_plain(smollm.model, capital, SamplingParams(max_tokens=64), (2,))
    assert short.finish_reason == "stop"
    n = len(short.token_ids)
    params = {"m": SamplingParams(max_tokens=n + 5, min_tokens=n + 2)}
    toks = tokens_of(run_staggered(engine, {"m": capital}, params, {"m": 0})["m"])
    assert len(toks) >= n + 2
    assert 2 not in toks[: n + 1]
    assert toks[: n - 1] == short.token_ids[: n - 1]
