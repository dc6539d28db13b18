"""``POST /v1/chat/completions``: messages → the model's chat template → generation."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from specserve.server.engine_client import EngineOutput
from specserve.server.errors import BadRequestError
from specserve.server.logprobs import ChatLogprobs
from specserve.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    DeltaMessage,
)
from specserve.server.request_params import check_prompt_ids
from specserve.server.serving import ChoiceContext, EndpointShape, serve_generation
from specserve.server.state import ServerState


def chat_prompt_ids(body: ChatCompletionRequest, state: ServerState) -> list[int]:
    """The conversation rendered with the model's chat template, as token ids (400 if the
    template refuses it or an id is out of the vocabulary)."""
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        ids = state.tokenizer.encode_chat(messages, body.add_generation_prompt)
    except (ValueError, TypeError, KeyError) as exc:  # template refused the conversation
        raise BadRequestError(f"chat template failed: {exc}", param="messages") from exc
    check_prompt_ids(ids, state.vocab_size, "messages")
    return ids


def logprob_request(body: ChatCompletionRequest) -> int | None:
    """Alternatives per token when the body asks for logprobs, else None (400 for
    ``top_logprobs`` without ``logprobs: true``, as OpenAI answers)."""
    if body.logprobs:
        return body.top_logprobs or 0
    if body.top_logprobs:
        raise BadRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    return None


def _logprobs(outputs: list[EngineOutput], ctx: ChoiceContext) -> ChatLogprobs | None:
    if ctx.logprobs is None:
        return None
    return ctx.logprobs.chat([lp for out in outputs for lp in out.logprobs or []])


def _step_choice(out: EngineOutput, first: bool, ctx: ChoiceContext) -> ChatChunkChoice:
    # The role rides on the first step's chunk rather than an extra token-less chunk,
    # so every chunk is one engine step (clients timing chunks see no fake first token).
    delta = DeltaMessage(role="assistant" if first else None, content=out.text_delta)
    return ChatChunkChoice(
        delta=delta, logprobs=_logprobs([out], ctx), finish_reason=out.finish_reason
    )


def _whole_choice(outputs: list[EngineOutput], ctx: ChoiceContext) -> ChatChoice:
    text = "".join(o.text_delta for o in outputs)
    return ChatChoice(
        message=ChatMessageOut(content=text),
        logprobs=_logprobs(outputs, ctx),
        finish_reason=outputs[-1].finish_reason,
    )


CHAT_SHAPE = EndpointShape(
    id_prefix="chatcmpl",
    prompt_param="messages",
    chunk_model=ChatCompletionChunk,
    response_model=ChatCompletionResponse,
    step_choice=_step_choice,
    whole_choice=_whole_choice,
)


async def create_chat_completion(
    body: ChatCompletionRequest, raw: Request, state: ServerState
) -> Response:
    return await serve_generation(
        body,
        raw,
        state,
        CHAT_SHAPE,
        prompt_ids=lambda: chat_prompt_ids(body, state),
        requested_max_tokens=body.requested_max_tokens(),
        default_max_tokens=None,
        logprobs=logprob_request(body),
    )
