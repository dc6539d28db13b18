"""``logprobs`` through the server, with speculation on: the response shapes of completions
(``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``, ``echo``) and chat
(``logprobs.content[]``), streamed and whole, equal to plain decoding's values; the limits and
the refusals (``n > 1``, ``response_format``). No lm-eval needed: the lm-eval request shape is
sent by hand."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.builder import build_engine_from_models
from tests.conftest import make_tiny_model
from tests.unit.server.conftest import MODEL, CharTokenizer, parse_sse, serve

PROMPTS = ["abcabcabcabcabc", "the cat sat on the mat; the cat sat", "0101010101"]
CHAT = [{"role": "user", "content": "abab abab abab"}]
SPECS = {
    "plain": SpecConfig(),
    "ngram": SpecConfig(method="ngram", num_speculative_tokens=3, ngram_min=1, ngram_max=3),
    "draft": SpecConfig(method="draft", draft_model="tiny-draft", num_speculative_tokens=2),
}
TOL = 1e-5
# CharTokenizer's special tokens: spelled out in logprobs' tokens, skipped in the text.
SPECIAL = {"<unk>": 94, "<s>": 95, "</s>": 96}


def token_id(text: str) -> int:
    """CharTokenizer's id of one token as logprobs spell it."""
    return SPECIAL[text] if text in SPECIAL else ord(text) - 32


def engine(spec: SpecConfig) -> AsyncEngine:
    config = EngineConfig(
        model=ModelConfig(model=MODEL),
        cache=CacheConfig(block_size=4, num_blocks=256),
        scheduler=SchedulerConfig(max_num_seqs=4),
        spec=spec,
    )
    draft = make_tiny_model("llama", seed=1) if spec.uses_draft_model else None
    llm = build_engine_from_models(
        config, make_tiny_model("llama"), CharTokenizer(), draft=draft, model_name=MODEL
    )
    return AsyncEngine(llm, CharTokenizer())


def merge_completion_logprobs(choices: list[dict[str, Any]]) -> dict[str, list[Any]]:
    merged: dict[str, list[Any]] = {
        "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []
    }  # fmt: skip
    for c in choices:
        if c["logprobs"] is not None:
            for key, values in merged.items():
                values.extend(c["logprobs"][key])
    return merged


async def completion(client: httpx.AsyncClient, stream: bool, **body: Any) -> dict[str, Any]:
    """The response's text, finish reason and logprobs (chunks merged when streamed)."""
    full = {"model": MODEL, "temperature": 0, "max_tokens": 14, "stream": stream, **body}
    r = await client.post("/v1/completions", json=full)
    assert r.status_code == 200, r.text
    if not stream:
        (choice,) = r.json()["choices"]
        return {"text": choice["text"], "logprobs": choice["logprobs"]}
    chunks = [e for e in parse_sse(r.text) if e != "[DONE]"]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    text = "".join(c["text"] for c in choices)
    if all(c["logprobs"] is None for c in choices):
        return {"text": text, "logprobs": None}
    return {"text": text, "logprobs": merge_completion_logprobs(choices)}


async def chat(client: httpx.AsyncClient, stream: bool, **body: Any) -> dict[str, Any]:
    full = {"model": MODEL, "messages": CHAT, "temperature": 0, "max_tokens": 12, **body}
    r = await client.post("/v1/chat/completions", json={**full, "stream": stream})
    assert r.status_code == 200, r.text
    if not stream:
        (choice,) = r.json()["choices"]
        return {"text": choice["message"]["content"], "logprobs": choice["logprobs"]}
    chunks = [e for e in parse_sse(r.text) if e != "[DONE]"]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    content = [t for c in choices for t in (c["logprobs"] or {}).get("content") or []]
    return {"text": "".join(c["delta"]["content"] for c in choices), "logprobs": content}


def assert_values_close(got: Any, want: Any) -> None:
    """Equal structure and strings, floats within TOL."""
    if isinstance(want, float):
        assert got == pytest.approx(want, abs=TOL)
    elif isinstance(want, dict):
        assert set(got) == set(want)
        for key in want:
            assert_values_close(got[key], want[key])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_values_close(g, w)
    else:
        assert got == want


async def answers(spec: str) -> list[dict[str, Any]]:
    out = []
    async with serve(engine(SPECS[spec])) as client:
        for stream in (False, True):
            for prompt in PROMPTS:
                out.append(await completion(client, stream, prompt=prompt, logprobs=3))
            out.append(await chat(client, stream, logprobs=True, top_logprobs=2))
            tokens = [[95, 33, 34, 33, 34, 33, 34]]  # lm-eval's shape: a batch of one
            out.append(await completion(client, stream, prompt=tokens, logprobs=1, echo=True))
    return out


@pytest.mark.parametrize("spec", ["ngram", "draft"])
async def test_speculative_logprobs_equal_plain_streamed_and_whole(spec: str) -> None:
    plain, speculative = await answers("plain"), await answers(spec)
    for p, s in zip(plain, speculative, strict=True):
        assert s["text"] == p["text"]
        assert_values_close(s["logprobs"], p["logprobs"])
    # Streamed and whole answers agree too.
    half = len(plain) // 2
    for whole, streamed in zip(plain[:half], plain[half:], strict=True):
        assert streamed["text"] == whole["text"]
        if isinstance(whole["logprobs"], dict) and "content" in whole["logprobs"]:
            assert_values_close(streamed["logprobs"], whole["logprobs"]["content"])
        else:
            assert_values_close(streamed["logprobs"], whole["logprobs"])


async def test_completion_logprobs_shape(client: httpx.AsyncClient) -> None:
    got = await completion(client, False, prompt="hello", logprobs=2, ignore_eos=True)
    lp, text = got["logprobs"], got["text"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    n = len(lp["tokens"])
    assert n == 14 and "".join(t for t in lp["tokens"] if t not in SPECIAL) == text
    assert lp["text_offset"][0] == 0
    for i in range(n - 1):
        assert lp["text_offset"][i + 1] == lp["text_offset"][i] + len(lp["tokens"][i])
    for token, value, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert value <= 0.0 and top[token] == value
        assert 2 <= len(top) <= 3  # the chosen token and the 2 most likely
        assert max(top.values()) == value  # greedy: the chosen token is the most likely
    zero = await completion(client, False, prompt="hello", logprobs=0, max_tokens=3)
    assert all(len(top) == 1 for top in zero["logprobs"]["top_logprobs"])
    none = await completion(client, False, prompt="hello", max_tokens=3)
    assert none["logprobs"] is None


async def test_echo_with_logprobs_scores_the_prompt(client: httpx.AsyncClient) -> None:
    """What lm-eval's loglikelihood sends: echo, logprobs=1, max_tokens=1, token ids."""
    gen = await completion(client, False, prompt="abcab", logprobs=0, max_tokens=6, ignore_eos=True)
    ids = CharTokenizer().encode("abcab")
    continuation = [token_id(t) for t in gen["logprobs"]["tokens"]]
    body = {"prompt": [ids + continuation], "logprobs": 1, "echo": True, "max_tokens": 1}
    got = await completion(client, False, **body)
    lp = got["logprobs"]
    assert got["text"].startswith("abcab" + gen["text"])
    assert len(continuation) == 6
    assert len(lp["tokens"]) == len(ids) + len(continuation) + 1
    assert lp["tokens"][0] == "<s>" and lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None
    # The continuation's prompt logprobs are what generating it gave (prefill vs decode).
    scored = lp["token_logprobs"][len(ids) : len(ids) + len(continuation)]
    assert scored == pytest.approx(gen["logprobs"]["token_logprobs"], abs=1e-4)
    # lm-eval's is_greedy test reads the top map of each continuation token.
    for value, top in zip(scored, lp["top_logprobs"][len(ids) : -1], strict=True):
        assert max(top.values()) == pytest.approx(value)
    # echo alone returns the prompt text.
    plain_echo = await completion(client, False, prompt="abcab", echo=True, max_tokens=2)
    assert plain_echo["text"].startswith("abcab") and plain_echo["logprobs"] is None


async def test_chat_logprobs_shape(client: httpx.AsyncClient) -> None:
    got = await chat(client, False, logprobs=True, top_logprobs=4, ignore_eos=True)
    content = got["logprobs"]["content"]
    assert len(content) == 12
    assert "".join(t["token"] for t in content if t["token"] not in SPECIAL) == got["text"]
    for t in content:
        assert set(t) == {"token", "logprob", "bytes", "top_logprobs"}
        assert t["bytes"] == list(t["token"].encode())
        assert len(t["top_logprobs"]) == 4
        values = [a["logprob"] for a in t["top_logprobs"]]
        assert values == sorted(values, reverse=True)
        assert t["top_logprobs"][0]["token"] == t["token"]  # greedy
    bare = await chat(client, False, logprobs=True)
    assert all(t["top_logprobs"] == [] for t in bare["logprobs"]["content"])
    assert (await chat(client, False))["logprobs"] is None
    assert (await chat(client, False, logprobs=False))["logprobs"] is None


BAD = [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "20"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "0"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "logprobs: true"),
    ("/v1/chat/completions", {"logprobs": 1}, "logprobs", "boolean"),
    ("/v1/completions", {"logprobs": 21}, "logprobs", "20"),
    ("/v1/completions", {"logprobs": True}, "logprobs", "integer"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs", "logprobs: N"),
    ("/v1/completions", {"prompt": [[1, 2], [3]]}, "prompt", "one request per prompt"),
    ("/v1/completions", {"n": 2}, "n", "n > 1 is not supported"),
    ("/v1/chat/completions", {"n": 3}, "n", "n > 1 is not supported"),
    ("/v1/completions", {"best_of": 2}, "best_of", "best_of > 1"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format",
     "constrained decoding"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format", "json_schema"),
    ("/v1/chat/completions", {"echo": True}, "echo", "/v1/completions"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "extra", "param", "says"), BAD)
async def test_refused_with_400_naming_the_limit(
    client: httpx.AsyncClient, path: str, extra: dict[str, Any], param: str, says: str
) -> None:
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
    base.update({"prompt": "x"} if path == "/v1/completions" else {"messages": CHAT})
    r = await client.post(path, json={**base, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err


async def test_neutral_values_pass(client: httpx.AsyncClient) -> None:
    for extra in ({"n": 1}, {"response_format": {"type": "text"}}, {"logprobs": None}):
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, **extra}
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, (extra, r.text)
