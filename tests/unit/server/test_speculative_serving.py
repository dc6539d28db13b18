"""Speculative engine behind the server (tiny model, n-gram drafts): greedy text equals the
baseline's at concurrency 1 and 8, chunks may carry several tokens, spec_decode is reported."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.builder import build_engine_from_models
from tests.conftest import make_tiny_model
from tests.unit.server.conftest import MODEL, CharTokenizer, parse_sse, serve

PROMPTS = [
    "abcabcabcabcabcabc",
    "the cat sat on the mat; the cat sat on the mat;",
    "0101010101",
    "xyz",
    "hello hello hello",
    "def f(x): return x\ndef f(x): return x\n",
    "aaaaaaaaaaaa",
    "zz top zz top",
]


def engine(spec: SpecConfig) -> AsyncEngine:
    config = EngineConfig(
        model=ModelConfig(model=MODEL),
        cache=CacheConfig(block_size=4, num_blocks=256),
        scheduler=SchedulerConfig(max_num_seqs=8),
        spec=spec,
    )
    llm = build_engine_from_models(
        config, make_tiny_model("llama"), tokenizer=CharTokenizer(), model_name=MODEL
    )
    return AsyncEngine(llm, CharTokenizer())


async def texts(client: httpx.AsyncClient, concurrency: int) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> dict[str, Any]:
        async with sem:
            r = await client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0},
            )
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

    return list(await asyncio.gather(*(one(p) for p in PROMPTS)))


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_speculative_greedy_text_equals_baseline(concurrency: int) -> None:
    async with serve(engine(SpecConfig())) as base:
        baseline = await texts(base, concurrency)
    spec = SpecConfig(method="ngram", num_speculative_tokens=3, ngram_min=1, ngram_max=3)
    async with serve(engine(spec)) as client:
        speculative = await texts(client, concurrency)
    for b, s in zip(baseline, speculative, strict=True):
        assert s["choices"][0]["text"] == b["choices"][0]["text"]
        assert s["usage"] == b["usage"]
        info = s["spec_decode"]
        assert info is not None and b["spec_decode"] is None
        assert 0 <= info["num_accepted_tokens"] <= info["num_draft_tokens"]
        assert info["mean_acceptance_length"] >= 1.0
    assert sum(s["spec_decode"]["num_drafts"] for s in speculative) > 0


async def test_stream_chunks_can_carry_several_tokens() -> None:
    spec = SpecConfig(method="ngram", num_speculative_tokens=4, ngram_min=1, ngram_max=3)
    async with serve(engine(spec)) as client:
        r = await client.post(
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": "aaaaaaaaaaaaaaaa",
                "max_tokens": 40,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
        events = parse_sse(r.text)
        chunks = events[:-2]
        counts = [c["usage"]["completion_tokens"] for c in chunks]
        steps = [b - a for a, b in zip([0, *counts], counts, strict=False)]
        assert sum(steps) == events[-2]["usage"]["completion_tokens"] == 40
        assert all(s >= 1 for s in steps)
        final = chunks[-1]["spec_decode"]
        assert all("spec_decode" not in c for c in chunks[:-1])
        # Each chunk is one engine step: tokens beyond one per chunk are accepted drafts.
        assert sum(steps) - len(steps) == final["num_accepted_tokens"]
        metrics = (await client.get("/metrics")).text
        assert "vllm:spec_decode_num_drafts_total" in metrics
        assert 'specserve:spec_k_chosen_count{model_name="tiny"}' in metrics


async def test_request_num_speculative_tokens_override_and_bound() -> None:
    spec = SpecConfig(method="ngram", num_speculative_tokens=3, ngram_min=1, ngram_max=3)
    body = {"model": MODEL, "prompt": "aaaaaaaaaaaa", "max_tokens": 12, "temperature": 0}
    async with serve(engine(spec)) as client:
        off = await client.post("/v1/completions", json={**body, "num_speculative_tokens": 0})
        assert off.status_code == 200, off.text
        assert off.json()["spec_decode"]["num_drafts"] == 0
        on = await client.post("/v1/completions", json={**body, "num_speculative_tokens": 2})
        assert on.status_code == 200, on.text
        assert on.json()["choices"][0]["text"] == off.json()["choices"][0]["text"]
        info = on.json()["spec_decode"]
        assert 0 < info["num_draft_tokens"] <= 2 * info["num_drafts"]
        too_big = await client.post("/v1/completions", json={**body, "num_speculative_tokens": 4})
        assert too_big.status_code == 400
        assert "k_max of 3" in too_big.json()["error"]["message"]
        negative = await client.post("/v1/completions", json={**body, "num_speculative_tokens": -1})
        assert negative.status_code == 400
