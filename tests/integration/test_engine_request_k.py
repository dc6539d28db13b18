"""A request's own ``num_speculative_tokens`` overrides the server's k (``specserve tune``
varies k per request on one server): it is honoured, stays lossless, and is refused beyond
the server's k_max or when speculation is off."""

from __future__ import annotations

import pytest

from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model
from tests.integration.test_engine_plain import run_staggered, tokens_of
from tests.integration.test_engine_spec import VOCAB, make_engine, prompts_and_params


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_request_k_is_used_and_lossless(k: int) -> None:
    target = make_tiny_model("llama", seed=3, vocab_size=VOCAB)
    engine = make_engine(target, "ngram", None)  # adaptive server, k_max 7
    prompts, base_params = prompts_and_params(4, seed=k)
    params = {
        rid: SamplingParams(max_tokens=p.max_tokens, num_speculative_tokens=k)
        for rid, p in base_params.items()
    }
    outs = run_staggered(engine, prompts, params, {rid: 0 for rid in prompts})
    for rid, prompt in prompts.items():
        ref = generate_plain(target, prompt, params[rid], target.cfg.eos_token_ids)
        assert tokens_of(outs[rid]) == ref.token_ids
        summary = outs[rid][-1].spec
        assert summary is not None
        if k == 0:
            assert summary.num_drafts == 0
        else:
            # Never more than k drafted per step (fewer near the output cap or on no match).
            assert summary.num_draft_tokens <= k * max(summary.num_drafts, 1)
    counts = engine.stats().k_chosen_counts
    assert set(counts) <= set(range(k + 1))


def test_request_k_beyond_server_k_max_is_refused() -> None:
    engine = make_engine(make_tiny_model("llama", seed=0, vocab_size=VOCAB), "ngram", 3)
    with pytest.raises(ValueError, match="exceeds this server's k_max of 3"):
        engine.add_request("r", [1, 2, 3], SamplingParams(num_speculative_tokens=4))


def test_request_k_without_speculation_is_refused() -> None:
    engine = make_engine(make_tiny_model("llama", seed=0, vocab_size=VOCAB), "none", None)
    with pytest.raises(ValueError, match="speculation is off"):
        engine.add_request("r", [1, 2, 3], SamplingParams(num_speculative_tokens=1))
    engine.add_request("ok", [1, 2, 3], SamplingParams(num_speculative_tokens=0, max_tokens=3))
