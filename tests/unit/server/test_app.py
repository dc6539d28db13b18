"""The app in-process (ASGI) over a real AsyncEngine on a tiny random model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import httpx
import torch

from specserve.sampling_params import SamplingParams
from specserve.server.app import create_app
from specserve.spec_decode.plain_loop import generate_plain
from tests.conftest import make_tiny_model
from tests.unit.server.conftest import MODEL, CharTokenizer, make_engine, parse_sse


async def complete(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/completions", json={"model": MODEL, **body})


async def test_health_ready_models(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).status_code == 200
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == MODEL and card["object"] == "model" and card["max_model_len"] > 0


async def test_greedy_completion_equals_plain_generation(client: httpx.AsyncClient) -> None:
    r = await complete(client, prompt="hello there", max_tokens=12, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["id"].startswith("cmpl-") and isinstance(body["created"], int)
    (choice,) = body["choices"]
    tok = CharTokenizer()
    prompt = tok.encode("hello there")
    ref = generate_plain(
        make_tiny_model("llama"), prompt, SamplingParams(max_tokens=12), tok.eos_token_ids
    )
    assert choice["text"] == tok.decode(ref.token_ids)
    assert choice["finish_reason"] == ref.finish_reason
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["completion_tokens"] == len(ref.token_ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert body["spec_decode"] is None  # speculation is off in this engine


async def test_token_id_prompt(client: httpx.AsyncClient) -> None:
    a = (await complete(client, prompt=[95, 40, 41, 42], max_tokens=5, temperature=0)).json()
    b = (await complete(client, prompt="HIJ", max_tokens=5, temperature=0)).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


async def test_stream_chunks_usage_and_done(client: httpx.AsyncClient) -> None:
    plain = await complete(client, prompt="abc", max_tokens=9, temperature=0)
    r = await complete(
        client,
        prompt="abc",
        max_tokens=9,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == plain.json()["usage"]
    chunks = events[:-2]
    # Plain decoding: one step commits one token, so one chunk per token.
    assert len(chunks) == plain.json()["usage"]["completion_tokens"]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == plain.json()["choices"][0]["text"]
    completion_counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion_counts == list(range(1, len(chunks) + 1))
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len({c["id"] for c in events[:-1]}) == 1


async def test_stream_without_usage_has_null_usage(client: httpx.AsyncClient) -> None:
    r = await complete(client, prompt="abc", max_tokens=3, temperature=0, stream=True)
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    assert all(e["usage"] is None and len(e["choices"]) == 1 for e in events[:-1])


async def test_chat_and_chat_stream(client: httpx.AsyncClient) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_completion_tokens": 6,
        "temperature": 0,
    }
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant"
    tok = CharTokenizer()
    prompt = tok.encode("[system] be brief\n[user] hi\n[assistant] ", add_special_tokens=False)
    assert out["usage"]["prompt_tokens"] == len(prompt)
    r = await client.post(
        "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = parse_sse(r.text)
    chunks = events[:-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["delta"]["role"] is None for c in chunks[1:])
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == msg["content"]
    assert events[-2]["usage"] == out["usage"]


async def test_seeded_sampling_is_reproducible(client: httpx.AsyncClient) -> None:
    kw: dict[str, Any] = dict(prompt="seed", max_tokens=10, temperature=1.5, top_k=20)
    a = (await complete(client, seed=11, **kw)).json()["choices"][0]["text"]
    b = (await complete(client, seed=11, **kw)).json()["choices"][0]["text"]
    assert a == b


async def test_concurrent_requests_complete(client: httpx.AsyncClient) -> None:
    rs = await asyncio.gather(
        *(complete(client, prompt=f"p{i}", max_tokens=4, temperature=0) for i in range(10))
    )
    assert [r.status_code for r in rs] == [200] * 10
    assert all(r.json()["usage"]["completion_tokens"] >= 1 for r in rs)


async def test_queue_full_is_429(make_client: Callable[..., Any]) -> None:
    async with make_client(max_queue_len=0) as client:
        r = await complete(client, prompt="x", max_tokens=2)
        assert r.status_code == 429
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
        r = await complete(client, prompt="x", max_tokens=2, stream=True)
        assert r.status_code == 429
        metrics = (await client.get("/metrics")).text
        assert 'specserve:requests_rejected_total{model_name="tiny",reason="queue_full"} 2.0' in (
            metrics
        )
        assert (await client.get("/health")).status_code == 200


async def test_metrics_after_requests(client: httpx.AsyncClient) -> None:
    await complete(client, prompt="abc", max_tokens=4, temperature=0, ignore_eos=True)
    await complete(client, prompt="abc", max_tokens=0)
    text = (await client.get("/metrics")).text
    assert 'vllm:request_success_total{finished_reason="length",model_name="tiny"} 1.0' in text
    assert 'vllm:generation_tokens_total{model_name="tiny"} 4.0' in text
    assert 'vllm:prompt_tokens_total{model_name="tiny"} 4.0' in text
    assert 'specserve:requests_rejected_total{model_name="tiny",reason="bad_request"} 1.0' in text
    assert 'vllm:time_to_first_token_seconds_count{model_name="tiny"} 1.0' in text
    assert 'vllm:num_requests_running{model_name="tiny"} 0.0' in text
    assert 'vllm:kv_cache_usage_perc{model_name="tiny"}' in text
    assert 'specserve:verify_time_seconds_count{model_name="tiny"}' in text


async def test_not_ready_while_loading_then_ready() -> None:
    release = threading.Event()

    def factory() -> Any:
        release.wait(timeout=60)
        return make_engine()

    app = create_app(served_model_name=MODEL, engine_factory=factory)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as client,
    ):
        assert (await client.get("/health")).status_code == 200
        r = await client.get("/v1/models")
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        assert (await client.get("/ready")).status_code == 503
        assert (await complete(client, prompt="x")).status_code == 503
        release.set()
        for _ in range(200):
            if (await client.get("/v1/models")).status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert (await client.get("/ready")).status_code == 200
        assert (await complete(client, prompt="x", max_tokens=2)).status_code == 200
    # lifespan exit shut the engine down (drained): the engine refuses new work
    assert app.state.server.draining


async def test_failed_load_reports_and_calls_back() -> None:
    failures: list[BaseException] = []

    def factory() -> Any:
        raise FileNotFoundError("no such model")

    app = create_app(
        served_model_name=MODEL, engine_factory=factory, on_load_failure=failures.append
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as client,
    ):
        for _ in range(100):
            if failures:
                break
            await asyncio.sleep(0.02)
        assert isinstance(failures[0], FileNotFoundError)
        r = await client.get("/health")
        assert r.status_code == 503 and "no such model" in r.json()["error"]["message"]


def test_tiny_model_is_deterministic() -> None:
    # The equality test above compares against a second copy of the model: same seed, same
    # weights.
    a, b = make_tiny_model("llama"), make_tiny_model("llama")
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
