"""Faults against real ``specserve serve`` processes (SmolLM2-135M, loopback): 200 concurrent
streams, the queue bound (429), SIGTERM draining in-flight requests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from specserve.server.launcher import ServerProcess
from tests.e2e.test_server_openai import MODEL, wait_idle

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


async def stream_one(http: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[int, int]:
    """(status, completion tokens from the usage chunk); 0 tokens if no usage arrived."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    tokens = 0
    async with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, 0
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                continue
            event = json.loads(data)
            assert "error" not in event, event
            if event.get("usage") and not event["choices"]:
                tokens = event["usage"]["completion_tokens"]
        assert done
    return 200, tokens


def test_200_concurrent_streams_no_errors_no_leaks(tmp_path: Path) -> None:
    args = ["--model", MODEL, "--max-model-len", "256", "--max-num-seqs", "32",
            "--max-queue-len", "512"]  # fmt: skip
    with ServerProcess(args, log_path=tmp_path / "server.log") as server:

        async def run() -> list[tuple[int, int]]:
            limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=600, limits=limits) as h:
                return list(
                    await asyncio.gather(*(stream_one(h, f"Item {i}:", 3) for i in range(200)))
                )

        results = asyncio.run(run())
        assert [s for s, _ in results] == [200] * 200
        assert [n for _, n in results] == [3] * 200
        m = wait_idle(server.base_url)
        assert m[("vllm:kv_cache_usage_perc", ())] == 0
        assert m[("vllm:num_requests_running", ())] == 0
        assert m[("vllm:request_success_total", (("finished_reason", "length"),))] == 200
        assert m[("vllm:generation_tokens_total", ())] == 600


def test_over_the_queue_bound_gets_429(tmp_path: Path) -> None:
    args = ["--model", MODEL, "--max-model-len", "256", "--max-num-seqs", "1",
            "--max-queue-len", "1"]  # fmt: skip
    with ServerProcess(args, log_path=tmp_path / "server.log") as server:

        async def run() -> list[tuple[int, int]]:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as h:
                return list(await asyncio.gather(*(stream_one(h, "Go:", 12) for _ in range(6))))

        statuses = [s for s, _ in asyncio.run(run())]
        assert statuses.count(429) >= 1, statuses
        assert statuses.count(200) >= 1, statuses
        assert set(statuses) <= {200, 429}
        m = wait_idle(server.base_url)
        rejected = m[("specserve:requests_rejected_total", (("reason", "queue_full"),))]
        assert rejected == statuses.count(429)
        assert m[("vllm:kv_cache_usage_perc", ())] == 0
        assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_sigterm_drains_in_flight_and_exits_zero(tmp_path: Path) -> None:
    server = ServerProcess(["--model", MODEL, "--max-model-len", "256"],
                           log_path=tmp_path / "server.log").start()  # fmt: skip
    try:
        body = {"model": MODEL, "prompt": "Describe a forest.", "max_tokens": 20,
                "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
        chunks = 0
        with (
            httpx.Client(base_url=server.base_url, timeout=120) as http,
            http.stream("POST", "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    chunks += 1
                    break
            assert server.proc is not None
            server.proc.send_signal(15)  # SIGTERM while the request is mid-stream
            saw_done = False
            for line in lines:
                if line.startswith("data: {"):
                    chunks += 1
                saw_done = saw_done or line == "data: [DONE]"
        assert saw_done and chunks == 20
        assert server.terminate(timeout_s=60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.base_url}/health", timeout=2)
    finally:
        server.stop()
