"""A mock OpenAI-compatible streaming server with timing knobs, to test the measurement code.

It speaks HTTP/1.1 over raw asyncio streams (keep-alive, chunked transfer encoding) so it
controls every TCP write: the tests need events split over several writes, empty chunks,
a usage-only final chunk, errors mid-stream and stalls. Timing is deadline-based (no drift):
the first chunk leaves ``ttft_ms`` after the request arrived, and each later chunk carrying k
tokens leaves k × ``itl_ms`` after the previous one, so per-token ITL is ``itl_ms`` whatever
``tokens_per_chunk`` is, and TPOT = (n − k) / (n − 1) × itl_ms for n tokens in chunks of k.

Run: ``python -m specserve.bench.mock_server --ttft-ms 50 --itl-ms 10 --port 8001``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Iterator

from specserve.bench.mock_config import MockConfig
from specserve.bench.mock_metrics import MockCounters

__all__ = ["MockConfig", "MockServer", "serve_in_thread", "token_text"]

logger = logging.getLogger(__name__)


def token_text(prompt: str, index: int) -> str:
    """The mock's deterministic ``index``-th output token for ``prompt`` (a word and a space)."""
    seed = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
    return f" w{(seed + 7 * index) % 1000}"


class MockServer:
    """The server; ``await start()`` in a running loop, or use :func:`serve_in_thread`."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.counters = MockCounters(config.spec_k, config.total_suffix)
        self._rng = random.Random(config.seed)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._handle, host, port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):  # e.g. stalled streams
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrival = time.perf_counter()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                keep = await self._route(method, path, body, writer, arrival)
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _route(
        self, method: str, path: str, body: bytes, w: asyncio.StreamWriter, arrival: float
    ) -> bool:
        path = path.split("?", 1)[0]
        if method == "GET" and path == "/health":
            return await _send(w, 200, b"{}")
        if method == "GET" and path in ("/v1/models", "/models"):
            card = {
                "id": self.config.model,
                "object": "model",
                "owned_by": "mock",
                "max_model_len": 4096,
            }
            return await _send(w, 200, json.dumps({"object": "list", "data": [card]}).encode())
        if method == "GET" and path == "/metrics":
            return await _send(w, 200, self.counters.render().encode(), "text/plain")
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            try:
                request = json.loads(body)
            except json.JSONDecodeError as e:
                return await _send(w, 400, _error_body(f"invalid JSON: {e}", 400))
            if self._rng.random() < self.config.error_rate:
                return await _send(w, 500, _error_body("injected error", 500))
            return await self._complete(request, path.endswith("chat/completions"), w, arrival)
        return await _send(w, 404, _error_body(f"no route {method} {path}", 404))

    async def _complete(
        self, request: dict, chat: bool, w: asyncio.StreamWriter, arrival: float
    ) -> bool:
        cfg = self.config
        if chat:
            prompt = json.dumps(request.get("messages", []), sort_keys=True)
        else:
            prompt = str(request.get("prompt", ""))
        max_tokens = int(request.get("max_tokens") or cfg.output_tokens)
        canned = cfg.reply_tokens()
        if canned is None:
            num_tokens = min(cfg.output_tokens, max_tokens)
            final_reason = "length" if num_tokens == max_tokens else "stop"
            texts = [token_text(prompt, i) for i in range(num_tokens)]
        else:  # the canned reply ends with a stop unless max_tokens cuts it
            texts = canned[:max_tokens]
            num_tokens = len(texts)
            final_reason = "length" if len(canned) > max_tokens else "stop"
        obj = "chat.completion" if chat else "text_completion"
        if not request.get("stream"):
            text = "".join(texts)
            choice = {"index": 0, "finish_reason": final_reason} | (
                {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            )
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": num_tokens}
            payload = {
                "id": "cmpl-mock",
                "object": obj,
                "model": cfg.model,
                "choices": [choice],
                "usage": usage,
            }
            return await _send(w, 200, json.dumps(payload).encode())
        opts = request.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage")) and not cfg.ignore_stream_options
        continuous = (
            include_usage and cfg.continuous_usage and bool(opts.get("continuous_usage_stats"))
        )
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        )
        obj += ".chunk"

        def chunk(text: str | None, done: int, finish: str | None = None) -> dict:
            c: dict = {"id": "cmpl-mock", "object": obj, "model": cfg.model, "choices": []}
            if text is not None:
                ch: dict = {"index": 0, "finish_reason": finish}
                ch |= {"delta": {"content": text}} if chat else {"text": text}
                c["choices"] = [ch]
            if continuous:
                c["usage"] = {
                    "prompt_tokens": 1,
                    "completion_tokens": done,
                    "total_tokens": 1 + done,
                }
            return c

        if chat:
            await self._event(
                w,
                {
                    "id": "cmpl-mock",
                    "object": obj,
                    "model": cfg.model,
                    "choices": [{"index": 0, "delta": {"role": "assistant"}}],
                },
            )
        deadline = arrival + cfg.ttft_ms / 1000
        done = 0
        while done < num_tokens:
            k = min(cfg.tokens_per_chunk, num_tokens - done)
            if done > 0:
                deadline += k * cfg.itl_ms / 1000
            await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            if cfg.empty_chunks:
                await self._event(w, chunk("", done))
            done += k
            finish = final_reason if done == num_tokens else None
            text = "".join(texts[done - k : done])
            if cfg.stamp_send_time:  # CLOCK_MONOTONIC: comparable across local processes
                text = f" @{time.perf_counter_ns()}" + text
            await self._event(w, chunk(text, done, finish))
            self.counters.step(k)
            if cfg.fail_after_tokens is not None and done >= cfg.fail_after_tokens:
                err = {"error": {"message": "injected mid-stream failure", "code": 500}}
                await self._event(w, err)
                break
            if cfg.abort_after_tokens is not None and done >= cfg.abort_after_tokens:
                w.transport.abort()
                return False
            if cfg.stall_after_tokens is not None and done >= cfg.stall_after_tokens:
                await asyncio.sleep(3600)
        if include_usage:
            usage = {"prompt_tokens": 1, "completion_tokens": done, "total_tokens": 1 + done}
            await self._event(
                w,
                {
                    "id": "cmpl-mock",
                    "object": obj,
                    "model": cfg.model,
                    "choices": [],
                    "usage": usage,
                },
            )
        await self._raw(w, b"data: [DONE]\n\n")
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True

    async def _event(self, w: asyncio.StreamWriter, payload: dict) -> None:
        await self._raw(w, b"data: " + json.dumps(payload).encode() + b"\n\n")

    async def _raw(self, w: asyncio.StreamWriter, data: bytes) -> None:
        if self.config.split_frames and len(data) >= 3:
            cut = (len(data) // 3, 2 * len(data) // 3)
            for piece in (data[: cut[0]], data[cut[0] : cut[1]], data[cut[1] :]):
                w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await w.drain()
                await asyncio.sleep(0.001)
            return
        w.write(b"%x\r\n%s\r\n" % (len(data), data))
        await w.drain()


def _error_body(message: str, code: int) -> bytes:
    return json.dumps({"error": {"message": message, "type": "mock_error", "code": code}}).encode()


async def _send(w: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "") -> bool:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}
    head = (
        f"HTTP/1.1 {status} {reason.get(status, 'Status')}\r\n"
        f"Content-Type: {ctype or 'application/json'}\r\nContent-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\n\r\n"
    )
    w.write(head.encode() + body)
    await w.drain()
    return True


@contextlib.contextmanager
def serve_in_thread(config: MockConfig, host: str = "127.0.0.1") -> Iterator[MockServer]:
    """Run a :class:`MockServer` on its own event loop in a daemon thread (for tests)."""
    server = MockServer(config)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start(host))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="mock-openai-server", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("mock server did not start within 10 s")
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Mock OpenAI-compatible streaming server.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spec-k", type=int, default=0)
    p.add_argument("--stamp-send-time", action="store_true")
    p.add_argument("--model", default="mock-model")
    p.add_argument("--reply", default=None, help="canned answer to every request")
    a = p.parse_args(argv)
    cfg = MockConfig(
        ttft_ms=a.ttft_ms,
        itl_ms=a.itl_ms,
        tokens_per_chunk=a.tokens_per_chunk,
        output_tokens=a.output_tokens,
        error_rate=a.error_rate,
        seed=a.seed,
        spec_k=a.spec_k,
        stamp_send_time=a.stamp_send_time,
        model=a.model,
        reply=a.reply,
    )
    logging.basicConfig(level=logging.INFO)

    async def serve() -> None:
        server = MockServer(cfg)
        port = await server.start(a.host, a.port)
        logger.info("mock server listening on http://%s:%d", a.host, port)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
