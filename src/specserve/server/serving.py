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
from dataclasses import dataclass, field

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specserve.server.engine_client import EngineOutput
from specserve.server.errors import APIError, UnsupportedFieldError
from specserve.server.logprobs import LogprobRenderer
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


@dataclass
class ChoiceContext:
    """What one request's choices are built with, besides the engine outputs.

    Attributes:
        prompt_ids: the prompt's token ids.
        logprobs: renders logprobs, or None when the request asked for none.
        echo: completions with ``echo``: the prompt text that the text starts with.
    """

    prompt_ids: list[int] = field(default_factory=list)
    logprobs: LogprobRenderer | None = None
    echo: str | None = None


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
        step_choice: the choice of a streamed chunk, from one engine step's output, whether
            it is the request's first chunk, and the request's :class:`ChoiceContext`.
        whole_choice: the choice of the whole response, from every engine output of the
            request, in order, and its :class:`ChoiceContext`.
    """

    id_prefix: str
    prompt_param: str
    chunk_model: type[BaseModel]
    response_model: type[BaseModel]
    step_choice: Callable[[EngineOutput, bool, ChoiceContext], BaseModel]
    whole_choice: Callable[[list[EngineOutput], ChoiceContext], BaseModel]


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
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    echo: Callable[[list[int]], str] | None = None,
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
        logprobs: alternatives per generated token when logprobs were asked for, else None
            (then nothing is computed).
        prompt_logprobs: the same for the prompt tokens, else None.
        echo: the prompt text to prepend (completions with ``echo``), from the prompt ids.
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
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )
    ctx = ChoiceContext(
        prompt_ids=ids,
        logprobs=None if logprobs is None else LogprobRenderer(state.tokenizer, logprobs),
        echo=None if echo is None else echo(ids),
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
        events = _stream_events(shape, head, run, first, body.stream_options, ctx)
        return RunStreamingResponse(events, run)

    outputs = [first]
    try:
        async for out in run.rest():
            outputs.append(out)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_STATUS)
    last = outputs[-1]
    response = shape.response_model(
        **head,
        choices=[shape.whole_choice(outputs, ctx)],
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
    ctx: ChoiceContext,
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
                choices=[shape.step_choice(out, is_first, ctx)],
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
