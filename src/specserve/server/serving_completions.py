"""``POST /v1/completions``: plain text (or token-id) prompts."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from specserve.server.engine_client import EngineOutput
from specserve.server.errors import BadRequestError, UnsupportedFieldError
from specserve.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from specserve.server.request_params import check_prompt_ids
from specserve.server.serving import EndpointShape, serve_generation
from specserve.server.state import ServerState

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


def prompt_token_ids(body: CompletionRequest, state: ServerState) -> list[int]:
    """Tokenise the prompt (text, one-element list of text, or token ids)."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) > 1:
            raise UnsupportedFieldError(
                "batched prompts (a list of several strings) are not supported; "
                "send one request per prompt",
                param="prompt",
            )
        prompt = str(prompt[0])
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequestError("prompt must not be empty", param="prompt")
        ids = list(state.tokenizer.encode(prompt, add_special_tokens=True))
    else:
        ids = [int(t) for t in prompt]
    check_prompt_ids(ids, state.vocab_size, "prompt")
    return ids


def _step_choice(out: EngineOutput, first: bool) -> CompletionChoice:
    return CompletionChoice(text=out.text_delta, finish_reason=out.finish_reason)


def _whole_choice(text: str, finish_reason: str | None) -> CompletionChoice:
    return CompletionChoice(text=text, finish_reason=finish_reason)


COMPLETION_SHAPE = EndpointShape(
    id_prefix="cmpl",
    prompt_param="prompt",
    chunk_model=CompletionResponse,
    response_model=CompletionResponse,
    step_choice=_step_choice,
    whole_choice=_whole_choice,
)


async def create_completion(body: CompletionRequest, raw: Request, state: ServerState) -> Response:
    return await serve_generation(
        body,
        raw,
        state,
        COMPLETION_SHAPE,
        prompt_ids=lambda: prompt_token_ids(body, state),
        requested_max_tokens=body.max_tokens,
        default_max_tokens=DEFAULT_MAX_TOKENS,
    )
