"""A real ``specserve serve`` process on loopback with SmolLM2-135M, driven by the official
``openai`` client and by raw HTTP: protocol, bad input, client disconnect, metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specserve.net import free_port
from specserve.server.launcher import ServerProcess

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
SERVE_ARGS = ["--model", MODEL, "--max-model-len", "512", "--max-num-seqs", "8"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = Path(tmp_path_factory.mktemp("serve")) / "server.log"
    with ServerProcess(SERVE_ARGS, log_path=log) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def metric_values(base_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def wait_idle(base_url: str, timeout_s: float = 60.0) -> dict[Any, float]:
    """Poll /metrics until nothing runs or waits and no KV block is in use."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metric_values(base_url)
        idle = (
            m[("vllm:num_requests_running", ())] == 0
            and m[("vllm:num_requests_waiting", ())] == 0
            and m[("vllm:kv_cache_usage_perc", ())] == 0
        )
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.25)


def test_models_and_health(server: ServerProcess, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_openai_completion_and_chat(client: openai.OpenAI) -> None:
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                  temperature=0)  # fmt: skip
    assert c.choices[0].text and c.choices[0].finish_reason in ("stop", "length")
    assert c.usage is not None and 1 <= c.usage.completion_tokens <= 8
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=10,
        temperature=0,
        seed=1,
    )
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.prompt_tokens > 3


def test_openai_streaming_with_usage(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12,
        temperature=0,
    )  # fmt: skip
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens  # type: ignore[union-attr]
    assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason

    cstream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    cchunks = list(cstream)
    assert cchunks[-1].usage is not None and cchunks[-1].usage.completion_tokens == 6
    assert sum(1 for c in cchunks if c.choices) == 6  # plain decoding: one token per step


def test_openai_client_reads_logprobs(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode())
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)  # greedy: the top token
    c = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2,
        echo=True,
    )  # fmt: skip
    lp = c.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert lp.token_logprobs[0] is None and c.choices[0].text.startswith("The capital")
    assert len(lp.tokens) == c.usage.prompt_tokens + c.usage.completion_tokens  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match="20"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2,
            logprobs=True, top_logprobs=21,
        )  # fmt: skip


BAD: list[tuple[str, Any, int]] = [
    ("/v1/completions", b"{oops", 400),
    ("/v1/completions", {"model": MODEL}, 400),
    ("/v1/completions", {"model": "nope", "prompt": "x"}, 404),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x " * 600}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 100000}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 2}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 3}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 21}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400),
]  # fmt: skip


async def test_bad_input_while_a_request_is_in_flight(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        good = asyncio.create_task(
            http.post("/v1/completions", json={"model": MODEL, "prompt": "Tell me a story",
                      "max_tokens": 24, "temperature": 0, "ignore_eos": True})
        )  # fmt: skip
        await asyncio.sleep(0.2)
        for path, body, status in BAD:
            if isinstance(body, bytes):
                r = await http.post(
                    path, content=body, headers={"content-type": "application/json"}
                )
            else:
                r = await http.post(path, json=body)
            assert r.status_code == status, (body, r.text)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        done = await good
        assert done.status_code == 200
        assert done.json()["usage"]["completion_tokens"] == 24
        assert (await http.get("/health")).status_code == 200


def test_client_disconnect_frees_blocks(server: ServerProcess) -> None:
    wait_idle(server.base_url)
    before = metric_values(server.base_url)
    aborted = ("vllm:request_success_total", (("finished_reason", "abort"),))
    body = {"model": MODEL, "prompt": "Write a long essay about the sea.", "max_tokens": 400,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    with (
        httpx.Client(base_url=server.base_url, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break  # leave mid-stream: closing the response drops the connection
    during = metric_values(server.base_url)
    after = wait_idle(server.base_url)
    assert after[("vllm:num_requests_running", ())] == 0
    assert after[("vllm:kv_cache_usage_perc", ())] == 0
    assert after[aborted] == before[aborted] + 1
    generated = (
        after[("vllm:generation_tokens_total", ())] - before[("vllm:generation_tokens_total", ())]
    )
    assert generated < 400, during  # it was stopped, not run to the end


def test_model_that_fails_to_load_exits_nonzero(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    proc = subprocess.run(
        [sys.executable, "-m", "specserve.cli", "serve", "--model", str(missing),
         "--host", "127.0.0.1", "--port", str(free_port())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "failed to load" in proc.stderr


def test_non_streaming_client_that_gives_up_frees_blocks(server: ServerProcess) -> None:
    wait_idle(server.base_url)
    aborted = ("vllm:request_success_total", (("finished_reason", "abort"),))
    before = metric_values(server.base_url)[aborted]
    body = {"model": MODEL, "prompt": "Write a long essay about mountains.", "max_tokens": 400,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=1.5)
    after = wait_idle(server.base_url)
    assert after[("vllm:kv_cache_usage_perc", ())] == 0
    assert after[aborted] == before + 1
