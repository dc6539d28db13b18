"""How an engine's draft model reads new prompts (``engine/drafting.py``, ``read_prompts``;
``spec_decode/prefill_budget.py``): at once, a chunk a step while the request decodes
plainly, or never; greedy output equals plain decoding whichever way."""

from __future__ import annotations

import random

import pytest

from specserve.engine.llm_engine import LLMEngine
from specserve.engine.outputs import RequestOutput
from specserve.models.decoder import DecoderLM
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model
from tests.integration.test_engine_plain import run_staggered, tokens_of
from tests.integration.test_engine_spec import VOCAB, make_engine

# (request, tokens asked for: None = all, its output tokens at the call)
Reads = list[tuple[str, int | None, int]]


def reading_engine() -> tuple[LLMEngine, DecoderLM, Reads]:
    """An adaptive draft-model engine whose proposer's prompt passes are logged."""
    target = make_tiny_model("llama", vocab_size=VOCAB)
    engine = make_engine(target, "draft", None, make_tiny_model("llama", vocab_size=VOCAB, seed=1))
    proposer = engine.proposer
    assert proposer is not None
    reads: Reads = []
    prefill = proposer.prefill  # type: ignore[attr-defined]

    def spy(request_id: str, prompt_ids: list[int], max_tokens: int | None = None) -> int:
        reads.append((request_id, max_tokens, engine.requests[request_id].num_output_tokens))
        return prefill(request_id, prompt_ids, max_tokens)

    proposer.prefill = spy  # type: ignore[attr-defined]
    return engine, target, reads


def assert_plain(engine: LLMEngine, target: DecoderLM, prompt: list[int], params: SamplingParams,
                 outs: list[RequestOutput]) -> None:  # fmt: skip
    ref = generate_plain(target, prompt, params, target.cfg.eos_token_ids)
    assert tokens_of(outs) == ref.token_ids


def random_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB - 1) for _ in range(n)]


def test_a_long_prompt_is_read_a_chunk_a_step_then_drafted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prompt whose pass only a long answer repays is not read at once: the step that
    samples the first token runs a first chunk (the cost not measured yet: ``min_tokens``,
    timed), and each later step a chunk of ``min_chunk`` while the request decodes without
    drafts, until the lane holds its committed tokens; then it drafts. Output equals plain
    decoding."""
    # the timings' best-case saving per token, fixed: the tiny pair's would be noise
    monkeypatch.setattr("specserve.engine.drafting.saving_per_token", lambda c, b: 1.0)
    engine, target, reads = reading_engine()
    budget = engine.prefill_budget
    budget.min_tokens, budget.min_chunk, budget.upfront_tokens = 8, 4, 0
    budget.step_share = 1e-9  # a chunk is min_chunk tokens
    prompt, params = random_prompt(30, seed=7), SamplingParams(max_tokens=24, ignore_eos=True)
    outs = run_staggered(engine, {"r": prompt}, {"r": params}, {"r": 0})["r"]
    assert reads[0] == ("r", 8, 1)  # with the first token, a first chunk of min_tokens
    assert budget.seconds_per_token is not None
    chunks = [n for _, n, _ in reads[1:]]
    # 22 prompt tokens left, 4 a step while one output token a step joins them
    assert chunks and all(n is not None and n <= 4 for n in chunks), chunks
    assert [done for _, _, done in reads] == list(range(1, len(reads) + 1))  # one a step
    reading_steps = len(reads)
    drafted = [o.spec.num_draft_tokens for o in outs]  # type: ignore[union-attr]
    assert not any(drafted[:reading_steps]), drafted  # no drafts while it reads
    assert any(drafted[reading_steps:]), drafted  # then it drafts
    stats = engine.stats()
    assert stats.num_prompts_undrafted == 0 and stats.num_prompts_chunked == 1
    assert stats.draft_prompt_token_s == budget.seconds_per_token
    assert_plain(engine, target, prompt, params, outs)


def test_reading_stops_where_the_rest_of_the_pass_can_no_longer_be_repaid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each reading step weighs the pass still to run against the cap still left: once it
    cannot be repaid, the request stops reading and decodes plainly to its end (counted as
    undrafted), and its lane is freed for other requests."""
    monkeypatch.setattr("specserve.engine.drafting.saving_per_token", lambda c, b: 1.0)
    engine, target, reads = reading_engine()
    budget = engine.prefill_budget
    budget.min_tokens, budget.min_chunk, budget.upfront_tokens = 8, 4, 0
    prompt, params = random_prompt(30, seed=8), SamplingParams(max_tokens=24, ignore_eos=True)
    engine.add_request("r", prompt, params)
    outs = engine.step()
    assert engine.requests["r"].draft_reading and reads == [("r", 8, 1)]
    budget.seconds_per_token = 100.0  # now 22 tokens cost 2200 s, the 23 tokens left save 23
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert reads == [("r", 8, 1)]
    assert engine.stats().num_prompts_undrafted == 1
    assert not any(o.spec.num_draft_tokens for o in outs)  # type: ignore[union-attr]
    assert engine.proposer is not None and not engine.proposer._lanes  # type: ignore[attr-defined]
    assert_plain(engine, target, prompt, params, outs)


def test_a_prompt_whose_pass_the_output_cannot_repay_decodes_plainly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the draft's cost per prompt token is measured, a new request whose output cap
    cannot repay the draft's pass over its prompt is not read by the draft: it decodes
    without drafts (greedy output equal to plain decoding) and the stats count it. A prompt
    a released lane already holds costs the draft nothing and is read as before."""
    monkeypatch.setattr("specserve.engine.drafting.saving_per_token", lambda c, b: 1.0)
    engine, target, reads = reading_engine()
    engine.prefill_budget.min_tokens = engine.prefill_budget.min_chunk = 8
    prompts = {"warm": random_prompt(40, seed=5), "new": random_prompt(40, seed=6)}
    prompts["held"] = prompts["warm"]
    params = {rid: SamplingParams(max_tokens=6, ignore_eos=True) for rid in prompts}
    params["warm"] = SamplingParams(max_tokens=40, ignore_eos=True)
    outs = {}
    for rid in prompts:  # one at a time
        outs.update(run_staggered(engine, {rid: prompts[rid]}, {rid: params[rid]}, {rid: 0}))
        if rid == "warm":  # the warm-up timed the pass (and read it all); make the pass dear
            assert engine.prefill_budget.seconds_per_token is not None
            assert any(o.spec.num_draft_tokens for o in outs["warm"])  # type: ignore[union-attr]
            engine.prefill_budget.seconds_per_token = 10.0  # 400 s for 40 tokens
    assert {rid for rid, _, _ in reads} == {"warm", "held"}
    assert [n for rid, n, _ in reads if rid == "held"] == [1]  # only its last token runs
    assert engine.stats().num_prompts_undrafted == 1
    assert not any(o.spec.num_draft_tokens for o in outs["new"])  # type: ignore[union-attr]
    for rid, prompt in prompts.items():
        assert_plain(engine, target, prompt, params[rid], outs[rid])
