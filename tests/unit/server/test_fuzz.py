"""Fuzz the request schema: whatever the body, the answer is never a 5xx (and never hangs)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specserve.server.app import create_app
from tests.unit.server.conftest import MODEL, make_engine

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 8),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = [
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "min_tokens", "stop", "stop_token_ids", "seed", "ignore_eos", "stream",
    "stream_options", "n", "logprobs", "echo", "user", "presence_penalty", "response_format",
]  # fmt: skip
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
        optional={"content": st.one_of(st.text(max_size=10), VALUES), "name": VALUES},
    ),
    max_size=3,
)
GOOD_BASE = {
    "/v1/completions": {"model": MODEL, "prompt": "fuzz", "max_tokens": 3},
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "fuzz"}],
        "max_tokens": 3,
    },
}


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, Any]:
    path = draw(st.sampled_from(sorted(GOOD_BASE)))
    kind = draw(st.sampled_from(["mutate", "random", "raw"]))
    if kind == "raw":
        return path, draw(st.binary(max_size=30))
    body: dict[str, Any] = dict(GOOD_BASE[path]) if kind == "mutate" else {}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
        if name == "messages":
            body[name] = draw(MESSAGES)
        elif name == "max_tokens" and draw(st.booleans()):
            body[name] = draw(st.integers(-2, 6))
        else:
            body[name] = draw(VALUES)
    return path, body


def test_fuzzed_bodies_never_get_5xx() -> None:
    runner = asyncio.Runner()
    engine = make_engine()
    app = create_app(served_model_name=MODEL, engine=engine)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fuzz")
    statuses: list[int] = []

    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        derandomize=True,
    )
    @given(bodies())
    def check(case: tuple[str, Any]) -> None:
        path, body = case
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        coro = client.post(path, content=content, headers={"content-type": "application/json"})
        r = runner.run(asyncio.wait_for(coro, timeout=60))
        statuses.append(r.status_code)
        assert r.status_code < 500, (body, r.text)
        if r.status_code >= 400:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}

    try:
        check()
        assert any(s == 200 for s in statuses) and any(400 <= s < 500 for s in statuses)
    finally:
        runner.run(client.aclose())
        runner.run(engine.shutdown(drain=False))
        runner.close()
