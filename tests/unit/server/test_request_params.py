"""HTTP body → SamplingParams: defaults and context-length refusals."""

from __future__ import annotations

import pytest

from specserve.server.errors import BadRequestError, ContextLengthError
from specserve.server.protocol import CompletionRequest
from specserve.server.request_params import build_sampling_params, check_prompt_ids


def params(body: dict[str, object], *, n_prompt: int = 10, max_len: int = 64, default=16):  # type: ignore[no-untyped-def]
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", **body})
    return build_sampling_params(
        req,
        requested_max_tokens=req.max_tokens,
        default_max_tokens=default,
        num_prompt_tokens=n_prompt,
        max_model_len=max_len,
        vocab_size=100,
        prompt_param="prompt",
    )


def test_defaults_follow_openai() -> None:
    p = params({})
    assert p.temperature == 1.0 and p.top_p == 1.0 and p.top_k == 0
    assert p.max_tokens == 16 and p.seed is None and p.stop == ()


def test_default_max_tokens_is_capped_by_room_and_none_means_room() -> None:
    assert params({}, n_prompt=60).max_tokens == 4
    assert params({}, n_prompt=10, default=None).max_tokens == 54


def test_values_pass_through() -> None:
    p = params(
        {
            "temperature": 0,
            "top_p": 0.5,
            "top_k": -1,
            "max_tokens": 5,
            "min_tokens": 2,
            "stop": ["a", "b"],
            "stop_token_ids": [3],
            "ignore_eos": True,
            "seed": 7,
        }
    )
    assert p.greedy and p.top_p == 0.5 and p.top_k == 0
    assert (p.max_tokens, p.min_tokens, p.stop, p.stop_token_ids) == (5, 2, ("a", "b"), (3,))
    assert p.ignore_eos and p.seed == 7


def test_prompt_filling_the_context_is_refused() -> None:
    with pytest.raises(ContextLengthError) as info:
        params({}, n_prompt=64, max_len=64)
    assert info.value.param == "prompt" and info.value.status_code == 400


def test_max_tokens_beyond_room_is_refused() -> None:
    params({"max_tokens": 54}, n_prompt=10, max_len=64)  # exactly fits
    with pytest.raises(ContextLengthError) as info:
        params({"max_tokens": 55}, n_prompt=10, max_len=64)
    assert info.value.param == "max_tokens"
    assert "65 tokens" in info.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"min_tokens": 6, "max_tokens": 5}, "min_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["s"] * 17}, "stop"),
        ({"stop_token_ids": [100]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_bad_values_name_their_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        params(body)
    assert info.value.param == param


def test_prompt_ids_checked_against_vocab() -> None:
    check_prompt_ids([0, 99], 100, "prompt")
    with pytest.raises(BadRequestError, match="empty"):
        check_prompt_ids([], 100, "prompt")
    with pytest.raises(BadRequestError, match="100"):
        check_prompt_ids([1, 100], 100, "prompt")
