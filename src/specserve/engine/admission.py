"""What the engine checks before it takes a request (``LLMEngine.validate``)."""

from __future__ import annotations

from collections.abc import Sequence

from specserve.sampling_params import SamplingParams


def check_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    vocab_size: int,
    max_model_len: int,
    *,
    has_tokenizer: bool,
    k_max: int,
) -> int:
    """The request's output cap: ``max_tokens`` within what the context leaves.

    Raises:
        ValueError: empty prompt, ids outside the vocabulary, prompt too long for the
            context, stop strings without a tokenizer, or a per-request k above ``k_max``.
    """
    n = len(prompt_token_ids)
    if n == 0:
        raise ValueError("prompt must contain at least one token")
    if any(not (0 <= t < vocab_size) for t in prompt_token_ids):
        raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
    if n >= max_model_len:
        raise ValueError(
            f"prompt of {n} tokens leaves no room for output in the {max_model_len}-token context"
        )
    if params.stop and not has_tokenizer:
        raise ValueError("stop strings need a tokenizer, and this engine has none")
    k = params.num_speculative_tokens
    if k is not None and k > k_max:
        raise ValueError(
            f"num_speculative_tokens={k} exceeds this server's k_max of {k_max}"
            + (" (speculation is off)" if k_max == 0 else "")
        )
    return min(params.max_tokens, max_model_len - n)
