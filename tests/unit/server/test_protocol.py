"""Request models and the unsupported-field check."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    find_unsupported_field,
)


def completion(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fields})


def chat(**fields: object) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", "hot"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("min_tokens", -1),
        ("stream", "yes-please"),
        ("stop", 3),
        ("stop_token_ids", ["a"]),
        ("seed", 2**70),
        ("model", ""),
        ("prompt", None),
        ("prompt", 12),
    ],
)
def test_completion_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        completion(**{field: value})
    assert info.value.errors()[0]["loc"][0] == field


def test_completion_accepts_token_ids_and_defaults() -> None:
    req = completion(prompt=[1, 2, 3])
    assert req.prompt == [1, 2, 3]
    assert req.temperature is None and req.max_tokens is None and not req.stream
    assert req.stop_strings() == ()
    assert completion(stop="x").stop_strings() == ("x",)
    assert completion(stop=["a", "b"]).stop_strings() == ("a", "b")


def test_chat_needs_messages_and_known_roles() -> None:
    with pytest.raises(ValidationError):
        chat(messages=[])
    with pytest.raises(ValidationError):
        chat(messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(ValidationError):  # images are not text parts
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    parts = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}] * 2}])
    assert parts.messages[0].text() == "aa"


def test_chat_max_completion_tokens_wins() -> None:
    assert chat(max_tokens=5).requested_max_tokens() == 5
    assert chat(max_tokens=5, max_completion_tokens=7).requested_max_tokens() == 7
    assert chat().requested_max_tokens() is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("n", True),
        ("best_of", 3),
        ("top_logprobs", 2),
        ("prompt_logprobs", 1),
        ("suffix", "x"),
        ("logit_bias", {"5": 10}),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1),
        ("tools", [{"type": "function"}]),
        ("response_format", {"type": "json_object"}),
        ("guided_json", {}),
        ("wat", 1),
    ],
)
def test_unsupported_fields_are_named(field: str, value: object) -> None:
    found = find_unsupported_field(completion(**{field: value}))
    assert found is not None
    assert found[0] == field
    assert field in found[1]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 1),
        ("best_of", 1),
        ("top_logprobs", 0),
        ("prompt_logprobs", 0),
        ("presence_penalty", 0),
        ("frequency_penalty", 0.0),
        ("logit_bias", {}),
        ("response_format", {"type": "text"}),
        ("user", "alice"),
        ("metadata", {"a": "b"}),
    ],
)
def test_neutral_values_and_harmless_fields_pass(field: str, value: object) -> None:
    assert find_unsupported_field(completion(**{field: value})) is None


def test_stream_options_need_stream() -> None:
    found = find_unsupported_field(completion(stream_options={"include_usage": True}))
    assert found is not None and found[0] == "stream_options"
    ok = completion(stream=True, stream_options={"include_usage": True})
    assert find_unsupported_field(ok) is None
    with pytest.raises(ValidationError):
        completion(stream=True, stream_options={"include_usage": True, "bogus": 1})


def test_tool_call_message_fields_are_refused() -> None:
    req = chat(messages=[{"role": "assistant", "content": None, "tool_calls": [{}]}])
    found = find_unsupported_field(req)
    assert found is not None and found[0] == "messages[0].tool_calls"
