"""Ask one arm one item over the OpenAI HTTP API (non-streaming, temperature 0)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from specserve.quality.items import Item


@dataclass(frozen=True)
class ArmEndpoint:
    """An OpenAI-compatible service: its root URL and the model name it serves."""

    base_url: str
    model: str


@dataclass(frozen=True)
class Answer:
    """A reply (``error`` set and ``text`` empty when the request failed)."""

    text: str
    finish_reason: str | None
    completion_tokens: int | None
    seconds: float
    error: str | None = None


# The OpenAI API takes up to 4 stop sequences, and vLLM's server refuses a request with more
# (HTTP 400: "List should have at most 4 items"). An item's further stop strings are applied
# by its task, which cuts every answer client-side at all of them (e.g. HumanEval's 6).
MAX_STOP_SEQUENCES = 4


def request_body(item: Item, model: str) -> dict[str, object]:
    body: dict[str, object] = {
        "model": model,
        "max_tokens": item.max_tokens,
        "temperature": 0.0,
        "stream": False,
    }
    if item.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": item.prompt}]
    else:
        body["prompt"] = item.prompt
    if item.stop:
        body["stop"] = list(item.stop[:MAX_STOP_SEQUENCES])
    return body


def ask(client: httpx.Client, arm: ArmEndpoint, item: Item) -> Answer:
    """Send ``item`` to ``arm``; an HTTP or transport error becomes ``Answer.error``."""
    path = "/v1/chat/completions" if item.endpoint == "chat" else "/v1/completions"
    start = time.perf_counter()
    try:
        resp = client.post(arm.base_url.rstrip("/") + path, json=request_body(item, arm.model))
        seconds = time.perf_counter() - start
        if resp.status_code != 200:
            return Answer("", None, None, seconds, f"HTTP {resp.status_code}: {resp.text[:300]}")
        data = resp.json()
        choice = data["choices"][0]
        text = choice["message"]["content"] if item.endpoint == "chat" else choice["text"]
        usage = data.get("usage") or {}
        return Answer(
            str(text or ""),
            choice.get("finish_reason"),
            usage.get("completion_tokens"),
            seconds,
        )
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        return Answer("", None, None, time.perf_counter() - start, f"{type(e).__name__}: {e}")
