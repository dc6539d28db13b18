"""What the generation endpoints (completions and chat completions) share.

Both endpoints check the body, turn it into a prompt and sampling parameters, start a
:class:`RequestRun` and then either stream one SSE chunk per engine step or collect the
whole text into one JSON response. They differ only in how the prompt is built and in the
shape of the choices they answer with; :class:`EndpointShape` holds those differences and
:func:`serve_generation` does the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specserve.server.engine_client import EngineOutput
from specserve.server.errors import APIError, UnsupportedFieldError
from specserve.server.protocol import (
    SamplingFields,
    StreamOptions,
    UsageInfo,
    find_unsupported_field,
    now_s,
    random_id,
)
from specserve.server.request_params import build_sampling_params
from specserve.server.request_run import ClientDisconnected, RequestRun, spec_info
from specserve.server.state import ServerState
from specserve.server.streaming import DONE_EVENT, RunStreamingResponse, sse_error_event, sse_event

logger = logging.getLogger(__name__)

CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request"; the client never sees it


@dataclass(frozen=True)
class EndpointShape:
    """How one generation endpoint names its requests and shapes its answers.

    Attributes:
        id_prefix: prefix of the response ids (``cmpl``, ``chatcmpl``).
        prompt_param: the body field that carries the prompt, named in context errors.
        chunk_model: the model of one streamed chunk; built with ``id``, ``created``,
            ``model``, ``choices``, ``usage`` and ``spec_decode``.
        response_model: the model of the whole (non-streamed) response; built with the same
            fields.
        step_choice: the choice of a streamed chunk, from one engine step's output and
            whether it is the request's first chunk.
        whole_choice: the choice of the whole response, from the full text and the finish
            reason.
    """

    id_prefix: str
    prompt_param: str
    chunk_model: type[BaseModel]
    response_model: type[BaseModel]
    step_choice: Callable[[EngineOutput, bool], BaseModel]
    whole_choice: Callable[[str, str | None], BaseModel]


def usage_of(out: EngineOutput) -> UsageInfo:
    """Token counts of an output so far."""
    return UsageInfo.of(out.num_prompt_tokens, out.num_generated_tokens)


async def serve_generation(
    body: SamplingFields,
    raw: Request,
    state: ServerState,
    shape: EndpointShape,
    *,
    prompt_ids: Callable[[], list[int]],
    requested_max_tokens: int | None,
    default_max_tokens: int | None,
) -> Response:
    """Answer one generation request, streamed or whole.

    Args:
        body: the validated request.
        raw: the HTTP request (watched for the client going away).
        state: the server's state (engine, tokenizer, metrics).
        shape: what differs between the endpoints.
        prompt_ids: tokenises the prompt; called once the field and model checks passed.
        requested_max_tokens: max_tokens as the client sent it (None when absent).
        default_max_tokens: used when absent; None means "the whole room".
    """
    arrival_s = time.perf_counter()
    refused = find_unsupported_field(body)
    if refused is not None:
        raise UnsupportedFieldError(refused[1], param=refused[0])
    state.check_model(body.model)
    engine = state.engine
    ids = prompt_ids()
    params = build_sampling_params(
        body,
        requested_max_tokens=requested_max_tokens,
        default_max_tokens=default_max_tokens,
        num_prompt_tokens=len(ids),
        max_model_len=engine.max_model_len,
        vocab_size=state.vocab_size,
        prompt_param=shape.prompt_param,
    )
    request_id = random_id(shape.id_prefix)
    run = RequestRun(engine, state.metrics.requests, raw, request_id, ids, params, arrival_s)
    created = now_s()
    try:
        first = await run.first()
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_STATUS)
    head: dict[str, str | int] = {
        "id": request_id,
        "created": created,
        "model": state.served_model_name,
    }

    if body.stream:
        events = _stream_events(shape, head, run, first, body.stream_options)
        return RunStreamingResponse(events, run)

    texts = [first.text_delta]
    last = first
    try:
        async for out in run.rest():
            texts.append(out.text_delta)
            last = out
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_STATUS)
    response = shape.response_model(
        **head,
        choices=[shape.whole_choice("".join(texts), last.finish_reason)],
        usage=usage_of(last),
        spec_decode=spec_info(last),
    )
    return JSONResponse(response.model_dump())


async def _stream_events(
    shape: EndpointShape,
    head: dict[str, str | int],
    run: RequestRun,
    first: EngineOutput,
    opts: StreamOptions | None,
) -> AsyncIterator[bytes]:
    """The SSE events of a streamed response: a chunk per engine step, an error event if
    the run fails, the usage-only chunk when asked for, then ``[DONE]``."""

    def chunk(out: EngineOutput, is_first: bool) -> bytes:
        usage = None
        if opts is not None and opts.continuous_usage_stats:
            usage = usage_of(out)
        return sse_event(
            shape.chunk_model(
                **head,
                choices=[shape.step_choice(out, is_first)],
                usage=usage,
                spec_decode=spec_info(out) if out.finished else None,
            )
        )

    out = first
    try:
        yield chunk(out, True)
        async for out in run.rest():
            yield chunk(out, False)
    except ClientDisconnected:
        return
    except APIError as err:
        yield sse_error_event(err)
    except Exception as exc:
        logger.exception("stream of %s failed", run.request_id)
        yield sse_error_event(APIError(f"internal error: {type(exc).__name__}: {exc}"))
    else:
        if opts is not None and opts.include_usage:
            yield sse_event(shape.chunk_model(**head, choices=[], usage=usage_of(out)))
    yield DONE_EVENT
