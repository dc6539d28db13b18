"""From a validated HTTP body to engine ``SamplingParams``, with the context-length checks.

Terms:
    room: tokens the context leaves after the prompt, ``max_model_len - num_prompt_tokens``.
    default max_tokens: 16 for completions (as OpenAI), the whole room for chat (as vLLM).
"""

from __future__ import annotations

from specserve.sampling_params import SamplingParams
from specserve.server.errors import BadRequestError, ContextLengthError
from specserve.server.protocol import SamplingFields

MAX_STOP_STRINGS = 16
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when the field is absent


def check_prompt_ids(prompt_ids: list[int], vocab_size: int, param: str) -> None:
    """Refuse an empty prompt or token ids outside the vocabulary."""
    if not prompt_ids:
        raise BadRequestError("prompt must not be empty", param=param)
    bad = [t for t in prompt_ids if not (0 <= t < vocab_size)]
    if bad:
        raise BadRequestError(
            f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})", param=param
        )


def build_sampling_params(
    body: SamplingFields,
    *,
    requested_max_tokens: int | None,
    default_max_tokens: int | None,
    num_prompt_tokens: int,
    max_model_len: int,
    vocab_size: int,
    prompt_param: str,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """Sampling parameters for ``body``; every refusal is a 400 naming the field.

    Args:
        body: the validated request.
        requested_max_tokens: max_tokens as the client sent it (None when absent).
        default_max_tokens: used when absent; None means "the whole room".
        num_prompt_tokens: prompt length after tokenisation / templating.
        max_model_len: the served context limit.
        vocab_size: for checking ``stop_token_ids``.
        prompt_param: the field that carried the prompt (``prompt`` or ``messages``).
        logprobs: alternatives per generated token when logprobs were asked for, else None.
        prompt_logprobs: the same for the prompt tokens (completions with ``echo``).
    """
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise ContextLengthError(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{num_prompt_tokens} tokens and leaves no room for output",
            param=prompt_param,
        )
    if requested_max_tokens is None:
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
    elif requested_max_tokens > room:
        raise ContextLengthError(
            f"this model's maximum context length is {max_model_len} tokens; you requested "
            f"{num_prompt_tokens + requested_max_tokens} tokens ({num_prompt_tokens} in the "
            f"prompt, {requested_max_tokens} for the completion)",
            param="max_tokens",
        )
    else:
        max_tokens = requested_max_tokens
    if body.min_tokens > max_tokens:
        raise BadRequestError(
            f"min_tokens ({body.min_tokens}) must not exceed max_tokens ({max_tokens})",
            param="min_tokens",
        )
    stop = body.stop_strings()
    if len(stop) > MAX_STOP_STRINGS:
        raise BadRequestError(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    if any(not s for s in stop):
        raise BadRequestError("stop strings must be non-empty", param="stop")
    stop_ids = tuple(body.stop_token_ids or ())
    bad = [t for t in stop_ids if not (0 <= t < vocab_size)]
    if bad:
        raise BadRequestError(
            f"stop token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
            param="stop_token_ids",
        )
    try:
        return SamplingParams(
            temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=0 if body.top_k is None else body.top_k,
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            stop=stop,
            stop_token_ids=stop_ids,
            ignore_eos=body.ignore_eos,
            seed=body.seed,
            num_speculative_tokens=body.num_speculative_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
    except ValueError as exc:  # defence in depth: the pydantic model should catch these
        raise BadRequestError(str(exc)) from exc
