"""``POST /v1/completions``: plain text (or token-id) prompts."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from specserve.sampling.logprobs import TokenLogprob
from specserve.server.engine_client import EngineOutput
from specserve.server.errors import BadRequestError, UnsupportedFieldError
from specserve.server.logprobs import CompletionLogprobs
from specserve.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from specserve.server.request_params import check_prompt_ids
from specserve.server.serving import ChoiceContext, EndpointShape, serve_generation
from specserve.server.state import ServerState

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


def single_prompt(body: CompletionRequest) -> str | list[int]:
    """The one prompt of the body: text or token ids (a one-element list is unwrapped)."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) > 1:
            raise UnsupportedFieldError(
                "batched prompts (a list of several prompts) are not supported; "
                "send one request per prompt",
                param="prompt",
            )
        inner = prompt[0]
        return inner if isinstance(inner, str) else [int(t) for t in inner]
    if isinstance(prompt, str):
        return prompt
    return [int(t) for t in prompt]  # type: ignore[arg-type]


def prompt_token_ids(body: CompletionRequest, state: ServerState) -> list[int]:
    """Tokenise the prompt (text, token ids, or a one-element list of either)."""
    prompt = single_prompt(body)
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequestError("prompt must not be empty", param="prompt")
        ids = list(state.tokenizer.encode(prompt, add_special_tokens=True))
    else:
        ids = prompt
    check_prompt_ids(ids, state.vocab_size, "prompt")
    return ids


def echo_text(body: CompletionRequest, state: ServerState, ids: list[int]) -> str:
    """The prompt as ``echo`` returns it: the text as sent, or token ids decoded."""
    prompt = single_prompt(body)
    if isinstance(prompt, str):
        return prompt
    return "" if state.tokenizer is None else str(state.tokenizer.decode(ids))


def _logprobs(
    outputs: list[EngineOutput], ctx: ChoiceContext, with_prompt: bool
) -> CompletionLogprobs | None:
    """The choice's logprobs over ``outputs`` (the echoed prompt's first when asked)."""
    if ctx.logprobs is None:
        return None
    entries: list[TokenLogprob | None] = []
    ids: list[int] = []
    if with_prompt and ctx.echo is not None and outputs and outputs[0].prompt_logprobs:
        entries.extend(outputs[0].prompt_logprobs)
        ids.extend(ctx.prompt_ids)
    for out in outputs:
        entries.extend(out.logprobs or [])
        ids.extend(out.new_token_ids)
    return ctx.logprobs.completion(entries, ids)


def _step_choice(out: EngineOutput, first: bool, ctx: ChoiceContext) -> CompletionChoice:
    text = (ctx.echo or "") + out.text_delta if first else out.text_delta
    return CompletionChoice(
        text=text,
        logprobs=_logprobs([out], ctx, with_prompt=first),
        finish_reason=out.finish_reason,
    )


def _whole_choice(outputs: list[EngineOutput], ctx: ChoiceContext) -> CompletionChoice:
    text = (ctx.echo or "") + "".join(o.text_delta for o in outputs)
    return CompletionChoice(
        text=text,
        logprobs=_logprobs(outputs, ctx, with_prompt=True),
        finish_reason=outputs[-1].finish_reason,
    )


COMPLETION_SHAPE = EndpointShape(
    id_prefix="cmpl",
    prompt_param="prompt",
    chunk_model=CompletionResponse,
    response_model=CompletionResponse,
    step_choice=_step_choice,
    whole_choice=_whole_choice,
)


async def create_completion(body: CompletionRequest, raw: Request, state: ServerState) -> Response:
    echo = bool(body.echo)
    return await serve_generation(
        body,
        raw,
        state,
        COMPLETION_SHAPE,
        prompt_ids=lambda: prompt_token_ids(body, state),
        requested_max_tokens=body.max_tokens,
        default_max_tokens=DEFAULT_MAX_TOKENS,
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if echo else None,
        echo=(lambda ids: echo_text(body, state, ids)) if echo else None,
    )
