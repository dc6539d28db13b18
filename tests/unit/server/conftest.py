"""In-process server fixtures: a real AsyncEngine on a tiny random model, a character-level
tokenizer, the FastAPI app and an httpx client over ASGI (no sockets)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from specserve.config import CacheConfig, SchedulerConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.llm_engine import LLMEngine
from specserve.server.app import create_app
from tests.conftest import make_tiny_model

MODEL = "tiny"


class CharTokenizer:
    """One token per printable ASCII character (ids 0..93), then <unk>, <s>, </s>.

    Matches the tiny model's vocabulary of 97 with EOS = 96."""

    unk_id, bos_token_id, eos_id = 94, 95, 96
    eos_token_ids = (96,)
    vocab_size = 97

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [ord(c) - 32 if 32 <= ord(c) < 126 else self.unk_id for c in text]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        special = {self.unk_id: "<unk>", self.bos_token_id: "<s>", self.eos_id: "</s>"}
        out = []
        for t in ids:
            if t in special:
                if not skip_special_tokens:
                    out.append(special[t])
            else:
                out.append(chr(t + 32))
        return "".join(out)

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        text = "".join(f"[{m['role']}] {m['content']}\n" for m in messages)
        return text + ("[assistant] " if add_generation_prompt else "")

    def encode_chat(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)


def make_engine(*, max_queue_len: int = 64, num_blocks: int = 128, **_: Any) -> AsyncEngine:
    llm = LLMEngine(
        make_tiny_model("llama"),
        tokenizer=CharTokenizer(),
        cache=CacheConfig(block_size=4, num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=4, max_queue_len=max_queue_len),
        model_name=MODEL,
    )
    return AsyncEngine(llm, CharTokenizer())


@asynccontextmanager
async def serve(engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(served_model_name=MODEL, engine=engine)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client
    finally:
        await engine.shutdown(drain=False)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with serve(make_engine()) as c:
        yield c


@pytest.fixture
def make_client() -> Callable[..., Any]:
    return lambda **kw: serve(make_engine(**kw))


def parse_sse(body: str) -> list[Any]:
    """Events of an SSE body: parsed JSON objects, and the string "[DONE]"."""
    assert body.endswith("\n\n"), body[-50:]
    events: list[Any] = []
    for block in body.strip("\n").split("\n\n"):
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events
