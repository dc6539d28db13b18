"""``POST /v1/completions``: plain text (or token-id) prompts."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specserve.server.engine_client import EngineOutput
from specserve.server.errors import APIError, BadRequestError, UnsupportedFieldError
from specserve.server.generation import ClientDisconnected, RequestRun, spec_info
from specserve.server.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    find_unsupported_field,
    now_s,
    random_id,
)
from specserve.server.request_params import build_sampling_params, check_prompt_ids
from specserve.server.state import ServerState
from specserve.server.streaming import DONE_EVENT, RunStreamingResponse, sse_error_event, sse_event

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions

CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request"; the client never sees it


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


async def create_completion(body: CompletionRequest, raw: Request, state: ServerState) -> Response:
    arrival_s = time.perf_counter()
    refused = find_unsupported_field(body)
    if refused is not None:
        raise UnsupportedFieldError(refused[1], param=refused[0])
    state.check_model(body.model)
    engine = state.engine
    ids = prompt_token_ids(body, state)
    params = build_sampling_params(
        body,
        requested_max_tokens=body.max_tokens,
        default_max_tokens=DEFAULT_MAX_TOKENS,
        num_prompt_tokens=len(ids),
        max_model_len=engine.max_model_len,
        vocab_size=state.vocab_size,
        prompt_param="prompt",
    )
    request_id = random_id("cmpl")
    run = RequestRun(engine, state.metrics.requests, raw, request_id, ids, params, arrival_s)
    created = now_s()
    try:
        first = await run.first()
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_STATUS)

    if body.stream:
        opts = body.stream_options

        def chunk(out: EngineOutput) -> bytes:
            usage = None
            if opts is not None and opts.continuous_usage_stats:
                usage = UsageInfo.of(out.num_prompt_tokens, out.num_generated_tokens)
            return sse_event(
                CompletionResponse(
                    id=request_id,
                    created=created,
                    model=state.served_model_name,
                    choices=[
                        CompletionChoice(text=out.text_delta, finish_reason=out.finish_reason)
                    ],
                    usage=usage,
                    spec_decode=spec_info(out) if out.finished else None,
                )
            )

        async def events() -> AsyncIterator[bytes]:
            out = first
            try:
                yield chunk(out)
                async for out in run.rest():
                    yield chunk(out)
            except ClientDisconnected:
                return
            except APIError as err:
                yield sse_error_event(err)
            except Exception as exc:
                logger.exception("stream of %s failed", request_id)
                yield sse_error_event(APIError(f"internal error: {type(exc).__name__}: {exc}"))
            else:
                if opts is not None and opts.include_usage:
                    usage = UsageInfo.of(out.num_prompt_tokens, out.num_generated_tokens)
                    yield sse_event(
                        CompletionResponse(
                            id=request_id,
                            created=created,
                            model=state.served_model_name,
                            choices=[],
                            usage=usage,
                        )
                    )
            yield DONE_EVENT

        return RunStreamingResponse(events(), run)

    texts = [first.text_delta]
    last = first
    try:
        async for out in run.rest():
            texts.append(out.text_delta)
            last = out
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_STATUS)
    response = CompletionResponse(
        id=request_id,
        created=created,
        model=state.served_model_name,
        choices=[CompletionChoice(text="".join(texts), finish_reason=last.finish_reason)],
        usage=UsageInfo.of(last.num_prompt_tokens, last.num_generated_tokens),
        spec_decode=spec_info(last),
    )
    return JSONResponse(response.model_dump(exclude_none=False))
