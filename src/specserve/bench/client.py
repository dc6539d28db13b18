"""HTTP-only streaming client: sends one OpenAI request and records every SSE chunk's time.

The client never imports the engine or the server; it measures any OpenAI-compatible
endpoint (ours, vLLM, SGLang, llama.cpp) the same way. It asks for
``stream_options: {include_usage: true, continuous_usage_stats: true}`` so servers that
support it report cumulative token counts on every chunk; others are handled in metrics.py.
Errors (HTTP status, error events mid-stream, dropped connections, timeouts) are recorded in
the request's record, never swallowed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable

import httpx

from specserve.bench.http1 import Http1Pool, HTTPProtocolError
from specserve.bench.inputs import SamplingConfig
from specserve.bench.records import ChunkRecord, RequestRecord
from specserve.bench.sse import SSEParser
from specserve.bench.workloads import Prompt


def request_body(
    prompt: Prompt, model: str, endpoint: str, sampling: SamplingConfig, stream: bool = True
) -> dict:
    """The JSON body for ``prompt`` (chat: one user message; completions: the raw text)."""
    body: dict = {"model": model, "max_tokens": prompt.max_tokens or sampling.max_tokens}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    body["temperature"] = sampling.temperature
    if sampling.min_tokens is not None:
        body["min_tokens"] = min(sampling.min_tokens, body["max_tokens"])
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


class StreamClient:
    """One shared connection pool; :meth:`send` is safe to call from many tasks at once.

    Streaming POSTs to ``http://`` servers go through :class:`Http1Pool` (raw asyncio
    streams: a few tens of microseconds per chunk); ``https://`` and the GETs use httpx.
    """

    def __init__(self, root_url: str, max_connections: int, timeout_s: float) -> None:
        self.root_url = root_url.rstrip("/")
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = httpx.AsyncClient(
            limits=limits, timeout=httpx.Timeout(timeout_s, pool=None), http2=False
        )
        self._pool = Http1Pool(self.root_url, timeout_s) if root_url.startswith("http:") else None

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._pool is not None:
            await self._pool.aclose()

    async def get_json(self, path: str) -> dict:
        """GET ``path`` and parse JSON (raises on HTTP errors)."""
        response = await self._http.get(self.root_url + path)
        response.raise_for_status()
        return dict(response.json())

    async def get_text(self, url: str) -> str:
        response = await self._http.get(url)
        response.raise_for_status()
        return response.text

    @contextlib.asynccontextmanager
    async def _post(
        self, path: str, body: dict
    ) -> AsyncIterator[tuple[int, Callable[[], AsyncIterator[bytes]], Callable[[], int | None]]]:
        """(status, body iterator, arrival time of the data last yielded or None) of a
        streamed POST, on the fast path when possible."""
        if self._pool is not None:
            response = await self._pool.post(path, json.dumps(body).encode())
            yield response.status, response.aiter_raw, response.arrival_ns
            return
        async with self._http.stream("POST", self.root_url + path, json=body) as r:
            yield r.status_code, r.aiter_raw, lambda: None

    async def send(self, record: RequestRecord, body: dict, endpoint: str, t0_ns: int) -> None:
        """Send ``body``, stream the answer, and fill ``record``'s raw fields in place."""
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        parser = SSEParser()
        texts: list[str] = []
        record.send_ns = now = time.perf_counter_ns() - t0_ns
        try:
            async with self._post(path, body) as (status, body_iter, arrival_ns):
                record.headers_ns = time.perf_counter_ns() - t0_ns
                record.status = status
                if status != 200:
                    raw = b"".join([piece async for piece in body_iter()])
                    text = raw.decode("utf-8", errors="replace")
                    record.error = f"HTTP {status}: {text[:500]}"
                    return
                done = False
                async for data in body_iter():
                    # When the bytes came off the socket (fast path), else when we got them.
                    now = (arrival_ns() or time.perf_counter_ns()) - t0_ns
                    for payload in parser.feed(data):
                        done = self._on_event(record, payload, now, texts) or done
                for payload in parser.flush():
                    done = self._on_event(record, payload, now, texts) or done
                if not done and record.finish_reason is None and record.error is None:
                    record.error = "stream ended without [DONE] or a finish_reason"
        except (httpx.TimeoutException, TimeoutError) as e:
            record.error = f"timeout: {type(e).__name__}"
        except (httpx.HTTPError, HTTPProtocolError, OSError) as e:
            record.error = f"{type(e).__name__}: {e}"
        finally:
            record.done_ns = time.perf_counter_ns() - t0_ns
            record.output_text = "".join(texts)
            record.output_sha256 = hashlib.sha256(record.output_text.encode()).hexdigest()

    @staticmethod
    def _on_event(record: RequestRecord, payload: str, now_ns: int, texts: list[str]) -> bool:
        """Record one SSE payload; returns True on ``[DONE]``."""
        if payload.strip() == "[DONE]":
            return True
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            record.error = f"malformed SSE payload: {payload[:200]!r}"
            return False
        if not isinstance(event, dict):
            record.error = f"unexpected SSE payload: {payload[:200]!r}"
            return False
        if "error" in event:
            err = event["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            record.error = f"error event mid-stream: {msg}"
            return False
        text = ""
        choices = event.get("choices") or []
        if choices:
            choice = choices[0]
            delta = choice.get("delta") or {}
            text = choice.get("text") or delta.get("content") or ""
            text += delta.get("reasoning_content") or ""
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]
        usage = event.get("usage") or None
        completion = usage.get("completion_tokens") if usage else None
        if completion is not None:
            record.usage_completion_tokens = int(completion)
        texts.append(text)
        record.chunks.append(
            ChunkRecord.model_construct(
                t_ns=now_ns,
                num_chars=len(text),
                usage_completion_tokens=None if completion is None else int(completion),
                has_choice=bool(choices),
                text=text,
            )
        )
        return False
