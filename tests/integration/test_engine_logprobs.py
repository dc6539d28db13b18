"""Logprobs with speculation on equal plain decoding's (fp32): every emitted token, whether an
accepted draft, a recovered or a bonus token, gets the target's raw log-probability at its
position; prompt logprobs cover every prompt token even when the prefix cache holds it."""

from __future__ import annotations

import pytest
import torch

from specserve.engine.llm_engine import LLMEngine
from specserve.engine.outputs import RequestOutput
from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.sampling.logprobs import TokenLogprob
from specserve.sampling_params import SamplingParams
from tests.conftest import make_tiny_model
from tests.integration.test_engine_plain import run_staggered, tokens_of
from tests.integration.test_engine_spec import VOCAB, make_engine, prompts_and_params

TOL = 1e-5
NUM_TOP = 3


def logprobs_of(outs: list[RequestOutput]) -> list[TokenLogprob]:
    found: list[TokenLogprob] = []
    for o in outs:
        assert o.logprobs is not None and len(o.logprobs) == len(o.new_token_ids)
        found.extend(o.logprobs)
    return found


def assert_close(got: list[TokenLogprob], want: list[TokenLogprob], tol: float = TOL) -> None:
    assert [g.token_id for g in got] == [w.token_id for w in want]
    for g, w in zip(got, want, strict=True):
        assert g.logprob == pytest.approx(w.logprob, abs=tol)
        assert [t for t, _ in g.top] == [t for t, _ in w.top]
        assert [v for _, v in g.top] == pytest.approx([v for _, v in w.top], abs=tol)


@torch.inference_mode()
def reference_logprobs(model: DecoderLM, ids: list[int]) -> torch.Tensor:
    """Raw log-softmax at every position of one full forward over ``ids`` (``# [n, V]``)."""
    cache = SingleSequenceCache(model, len(ids))
    return torch.log_softmax(model.compute_logits(cache.forward(ids)).float(), dim=-1)


def run(engine: LLMEngine, params: dict[str, SamplingParams], prompts: dict[str, list[int]]):
    return run_staggered(engine, prompts, params, {rid: i for i, rid in enumerate(prompts)})


@pytest.mark.parametrize(("method", "k"), [("ngram", 3), ("ngram", None), ("draft", 4)])
def test_speculative_logprobs_equal_plain(method: str, k: int | None) -> None:
    target = make_tiny_model("qwen3", vocab_size=VOCAB)
    draft = make_tiny_model("qwen3", seed=1, vocab_size=VOCAB) if method == "draft" else None
    prompts, params = prompts_and_params(5, seed=3)
    params = {
        rid: SamplingParams(max_tokens=p.max_tokens + 8, logprobs=NUM_TOP)
        for rid, p in params.items()
    }
    spec_engine = make_engine(target, method, k, draft)
    plain_engine = make_engine(target, "none", None)
    spec = run(spec_engine, params, prompts)
    plain = run(plain_engine, params, prompts)
    assert spec_engine.stats().spec.num_accepted_tokens > 0, "no draft was accepted"
    for rid in prompts:
        assert tokens_of(spec[rid]) == tokens_of(plain[rid]), rid
        assert_close(logprobs_of(spec[rid]), logprobs_of(plain[rid]))
        lps = logprobs_of(spec[rid])
        assert all(len(lp.top) == NUM_TOP for lp in lps)
        # The top list is sorted and, greedy, starts with the emitted token.
        assert all(lp.top[0] == (lp.token_id, lp.logprob) for lp in lps)


def test_sampled_speculative_logprobs_are_the_targets_raw_distribution() -> None:
    """Sampled tokens (temperature, top-k) differ between runs, but each one's logprob is the
    raw model's at its position, whatever processing chose it."""
    target = make_tiny_model("llama", vocab_size=VOCAB)
    draft = make_tiny_model("llama", seed=2, vocab_size=VOCAB)
    engine = make_engine(target, "draft", 3, draft)
    prompts, _ = prompts_and_params(3, seed=4)
    params = {
        rid: SamplingParams(temperature=0.7, top_k=5, max_tokens=12, seed=i, logprobs=0)
        for i, rid in enumerate(prompts)
    }
    outs = run(engine, params, prompts)
    assert engine.stats().spec.num_accepted_tokens > 0
    for rid, prompt in prompts.items():
        out = tokens_of(outs[rid])
        ref = reference_logprobs(target, prompt + out)
        lps = logprobs_of(outs[rid])
        for j, lp in enumerate(lps):
            assert lp.top == ()
            want = float(ref[len(prompt) - 1 + j, lp.token_id])
            assert lp.logprob == pytest.approx(want, abs=1e-4)


def test_no_logprobs_unless_asked() -> None:
    target = make_tiny_model("llama", vocab_size=VOCAB)
    engine = make_engine(target, "ngram", 3)
    prompts, params = prompts_and_params(2, seed=5)
    for outs in run(engine, params, prompts).values():
        assert all(o.logprobs is None and o.prompt_logprobs is None for o in outs)


def test_prompt_logprobs_cover_every_token_despite_prefix_cache_and_chunks() -> None:
    target = make_tiny_model("qwen2", vocab_size=VOCAB)
    engine = make_engine(target, "ngram", 3)  # 32-token step budget: long prompts are chunked
    prompt = [(i * 5) % (VOCAB - 1) for i in range(45)]
    plain = SamplingParams(max_tokens=3)
    echo = SamplingParams(max_tokens=3, logprobs=1, prompt_logprobs=2)
    # The first request fills the prefix cache; the second must still compute every position.
    outs = run(engine, {"warm": plain, "echo": echo}, {"warm": prompt, "echo": prompt})
    firsts = [o for o in outs["echo"] if o.prompt_logprobs is not None]
    assert len(firsts) == 1 and firsts[0].new_token_ids
    got = firsts[0].prompt_logprobs
    assert got is not None and len(got) == len(prompt) and got[0] is None
    ref = reference_logprobs(target, prompt)
    for p, lp in enumerate(got[1:], start=1):
        assert lp is not None and lp.token_id == prompt[p]
        assert lp.logprob == pytest.approx(float(ref[p - 1, prompt[p]]), abs=1e-4)
        ids = ref[p - 1].topk(2).indices
        assert [t for t, _ in lp.top] == ids.tolist()
    assert tokens_of(outs["echo"]) == tokens_of(outs["warm"])
    engine.kv.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0
