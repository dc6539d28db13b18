"""Bad input: every case gets an OpenAI-style error body with a 4xx status, never a 5xx."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.unit.server.conftest import MODEL

CHAT = [{"role": "user", "content": "hi"}]

# (path, body or raw bytes, expected status, expected param)
CASES: list[tuple[str, Any, int, str | None]] = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"prompt": "x"}, 400, "model"),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 500]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 600}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**6}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 1.01}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_k": -3}, 400, "top_k"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "best_of": 2}, 400, "best_of"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "echo": "yes"}, 400, "echo"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"1": 5}}, 400, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "presence_penalty": 1}, 400,
     "presence_penalty"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "min_tokens": 9, "max_tokens": 3}, 400,
     "min_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop_token_ids": [97]}, 400,
     "stop_token_ids"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream_options": {}}, 400,
     "stream_options"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot"}]}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "tools": [{"type": "function"}]},
     400, "tools"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT,
     "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 10**6}, 400,
     "max_tokens"),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": CHAT}, 404, "model"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
async def test_bad_input_gets_openai_error(
    client: httpx.AsyncClient, path: str, body: Any, status: int, param: str | None
) -> None:
    if isinstance(body, bytes):
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    assert err["param"] == param
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = await client.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


async def test_server_still_serves_after_bad_input(client: httpx.AsyncClient) -> None:
    for path, body, _, _ in CASES[:8]:
        if isinstance(body, bytes):
            await client.post(path, content=body)
        else:
            await client.post(path, json=body)
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 2})
    assert r.status_code == 200
