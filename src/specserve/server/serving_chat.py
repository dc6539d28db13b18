"""``POST /v1/chat/completions``: messages → the model's chat template → generation."""

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
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    DeltaMessage,
    UsageInfo,
    find_unsupported_field,
    now_s,
    random_id,
)
from specserve.server.request_params import build_sampling_params, check_prompt_ids
from specserve.server.serving_completions import CLIENT_CLOSED_STATUS
from specserve.server.state import ServerState
from specserve.server.streaming import DONE_EVENT, RunStreamingResponse, sse_error_event, sse_event

logger = logging.getLogger(__name__)


def chat_prompt_ids(body: ChatCompletionRequest, state: ServerState) -> list[int]:
    """Render the conversation with the model's chat template and tokenise it.

    The template already holds any special tokens the model wants (BOS, turn markers), so
    the text is encoded without adding more.
    """
    tokenizer = state.tokenizer
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt
        )
    except (ValueError, TypeError, KeyError) as exc:  # template refused the conversation
        raise BadRequestError(f"chat template failed: {exc}", param="messages") from exc
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    check_prompt_ids(ids, state.vocab_size, "messages")
    return ids


async def create_chat_completion(
    body: ChatCompletionRequest, raw: Request, state: ServerState
) -> Response:
    arrival_s = time.perf_counter()
    refused = find_unsupported_field(body)
    if refused is not None:
        raise UnsupportedFieldError(refused[1], param=refused[0])
    state.check_model(body.model)
    engine = state.engine
    ids = chat_prompt_ids(body, state)
    requested = body.requested_max_tokens()
    params = build_sampling_params(
        body,
        requested_max_tokens=requested,
        default_max_tokens=None,
        num_prompt_tokens=len(ids),
        max_model_len=engine.max_model_len,
        vocab_size=state.vocab_size,
        prompt_param="messages",
    )
    request_id = random_id("chatcmpl")
    run = RequestRun(engine, state.metrics.requests, raw, request_id, ids, params, arrival_s)
    created = now_s()
    try:
        first = await run.first()
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_STATUS)

    if body.stream:
        opts = body.stream_options

        def chunk(out: EngineOutput, role: bool) -> bytes:
            usage = None
            if opts is not None and opts.continuous_usage_stats:
                usage = UsageInfo.of(out.num_prompt_tokens, out.num_generated_tokens)
            # The role rides on the first step's chunk rather than an extra token-less chunk,
            # so every chunk is one engine step (clients timing chunks see no fake first token).
            delta = DeltaMessage(role="assistant" if role else None, content=out.text_delta)
            return sse_event(
                ChatCompletionChunk(
                    id=request_id,
                    created=created,
                    model=state.served_model_name,
                    choices=[ChatChunkChoice(delta=delta, finish_reason=out.finish_reason)],
                    usage=usage,
                    spec_decode=spec_info(out) if out.finished else None,
                )
            )

        async def events() -> AsyncIterator[bytes]:
            out = first
            try:
                yield chunk(out, role=True)
                async for out in run.rest():
                    yield chunk(out, role=False)
            except ClientDisconnected:
                return
            except APIError as err:
                yield sse_error_event(err)
            except Exception as exc:
                logger.exception("stream of %s failed", request_id)
                yield sse_error_event(APIError(f"internal error: {type(exc).__name__}: {exc}"))
            else:
                if opts is not None and opts.include_usage:
                    yield sse_event(
                        ChatCompletionChunk(
                            id=request_id,
                            created=created,
                            model=state.served_model_name,
                            choices=[],
                            usage=UsageInfo.of(out.num_prompt_tokens, out.num_generated_tokens),
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
    response = ChatCompletionResponse(
        id=request_id,
        created=created,
        model=state.served_model_name,
        choices=[
            ChatChoice(
                message=ChatMessageOut(content="".join(texts)), finish_reason=last.finish_reason
            )
        ],
        usage=UsageInfo.of(last.num_prompt_tokens, last.num_generated_tokens),
        spec_decode=spec_info(last),
    )
    return JSONResponse(response.model_dump())
