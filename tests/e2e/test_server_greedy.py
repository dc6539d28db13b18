"""Greedy equality through the server: a speculative ``specserve serve`` answers exactly the
baseline server's text (fp32, SmolLM2-135M) at concurrency 1 and 8."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from specserve.server.launcher import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
BASE_ARGS = ["--model", MODEL, "--dtype", "float32", "--max-model-len", "512",
             "--max-num-seqs", "8"]  # fmt: skip
PROMPTS = [
    "Repeat the following line 4 times: the cat sat on the mat.",
    "Write a Python function that checks whether a string is a palindrome.",
    "List the numbers from 1 to 12 separated by commas.",
    "What is the capital of France?",
    "Convert to JSON: name Alice, age 30, city Paris.",
    "Write a haiku about autumn.",
    "Explain recursion in one sentence.",
    "Fix the bug: def add(a, b): return a - b",
]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = Path(tmp_path_factory.mktemp("base")) / "server.log"
    with ServerProcess(BASE_ARGS, log_path=log) as proc:
        yield proc


async def answers(base_url: str, concurrency: int) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(concurrency)

    async def one(http: httpx.AsyncClient, prompt: str) -> dict[str, Any]:
        async with sem:
            r = await http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                      "max_tokens": 24, "temperature": 0},
            )  # fmt: skip
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        return list(await asyncio.gather(*(one(http, p) for p in PROMPTS)))


@pytest.mark.parametrize(
    "spec_args",
    [
        ["--spec-method", "ngram", "--num-speculative-tokens", "3"],
        ["--draft-model", MODEL, "--num-speculative-tokens", "auto"],
    ],
    ids=["ngram-k3", "draft-auto"],
)
def test_speculative_server_text_equals_baseline(
    baseline: ServerProcess, spec_args: list[str], tmp_path: Path
) -> None:
    with ServerProcess([*BASE_ARGS, *spec_args], log_path=tmp_path / "spec.log") as spec:
        for concurrency in (1, 8):
            want = asyncio.run(answers(baseline.base_url, concurrency))
            got = asyncio.run(answers(spec.base_url, concurrency))
            for prompt, w, g in zip(PROMPTS, want, got, strict=True):
                assert (
                    g["choices"][0]["message"]["content"] == w["choices"][0]["message"]["content"]
                ), (
                    prompt,
                    concurrency,
                )
                assert g["usage"] == w["usage"]
                assert g["spec_decode"] is not None and w["spec_decode"] is None
        drafts = sum(g["spec_decode"]["num_drafts"] for g in got)
        assert drafts > 0
