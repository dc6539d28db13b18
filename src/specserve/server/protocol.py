"""OpenAI-compatible request and response bodies (pydantic v2).

Requests are validated in two layers: the pydantic models below check types and ranges
(a failure becomes HTTP 400 with the offending field as ``param``), then
:func:`find_unsupported_field` refuses OpenAI features this server does not implement
(``n > 1``, ``response_format`` other than text, tools, ...) instead of silently ignoring
them. A field set to its
neutral value (``n=1``, ``presence_penalty=0``, ``logprobs=null``) is accepted, so clients that
always send defaults keep working. Fields this server has never heard of are refused too,
except a short list of harmless ones (``user``, ``metadata``, ...).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specserve.sampling_params import MAX_LOGPROBS
from specserve.server.logprobs import ChatLogprobs, CompletionLogprobs

# Accepted and ignored: they do not change what is generated.
HARMLESS_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "request_id"})

# field -> its neutral value(s); any other value is refused with HTTP 400 naming the field.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "top_logprobs": (0,),
    "echo": (False,),
    "suffix": ("",),
    "logit_bias": ({},),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (False,),
    "response_format": ({"type": "text"},),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "prompt_logprobs": (0,),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
}

# Why a field is refused, where there is more to say than "not supported".
REFUSAL_REASONS: dict[str, str] = {
    "n": "n > 1 is not supported: send one request per completion (with distinct seeds when "
    "sampling)",
    "best_of": "best_of > 1 is not supported: send one request per candidate",
    "response_format": "only response_format {'type': 'text'} is supported: json_object and "
    "json_schema need constrained decoding, which this server does not implement",
    "top_logprobs": "top_logprobs is a chat completions field; /v1/completions takes logprobs: N",
    "echo": "echo is a /v1/completions field",
}


class OpenAIModel(BaseModel):
    """Base for request bodies: strict types (``"5"`` is not an int), unknown keys kept (then
    checked by :func:`find_unsupported_field`) so the error can name them."""

    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(BaseModel):
    """``stream_options`` of a streaming request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = Field(
        False, description="Send a final chunk with empty choices carrying the usage."
    )
    continuous_usage_stats: bool = Field(
        False, description="Carry the running usage in every chunk (vLLM extension)."
    )


class SamplingFields(OpenAIModel):
    """Fields shared by completions and chat completions."""

    model: str = Field(..., min_length=1, description="Served model name (see /v1/models).")
    stream: bool = Field(False, description="Stream Server-Sent Events, one chunk per step.")
    stream_options: StreamOptions | None = Field(None, description="Only with stream=true.")
    max_tokens: int | None = Field(
        None, ge=1, description="Most tokens to generate; must fit in the context."
    )
    temperature: float | None = Field(
        None, ge=0.0, allow_inf_nan=False, description="0 is greedy. Default 1.0."
    )
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, allow_inf_nan=False, description="Nucleus mass in (0, 1]."
    )
    top_k: int | None = Field(None, ge=-1, description="Keep the k most likely; -1 or 0: off.")
    min_tokens: int = Field(0, ge=0, description="Suppress EOS/stop ids before this many.")
    stop: str | list[str] | None = Field(
        None, description="Up to 16 non-empty strings that end generation (not returned)."
    )
    stop_token_ids: list[int] | None = Field(
        None, max_length=64, description="Extra token ids that end generation."
    )
    ignore_eos: bool = Field(False, description="Keep generating past EOS.")
    seed: int | None = Field(
        None, ge=-(2**63), lt=2**63, description="Per-request seed for reproducible sampling."
    )
    num_speculative_tokens: int | None = Field(
        None,
        ge=0,
        le=32,
        description="specserve extension: fixed draft length k for this request (0: none), "
        "at most the server's k_max; default: the server's setting.",
    )

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(SamplingFields):
    """``POST /v1/completions`` body."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ...,
        description="Text, a list of token ids, or a one-element list of either (what batching "
        "clients such as lm-eval send).",
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description=f"Return each token's logprob and the N (0..{MAX_LOGPROBS}) most likely "
        "alternatives (OpenAI allows 5; 20 as vLLM).",
    )
    echo: bool | None = Field(
        None, description="Prepend the prompt to the text (and its logprobs with logprobs)."
    )


class TextContentPart(BaseModel):
    """A ``{"type": "text", "text": ...}`` part of a chat message's content."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat message; content is text or a list of text parts."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions`` body."""

    messages: list[ChatMessage] = Field(..., min_length=1, description="The conversation.")
    max_completion_tokens: int | None = Field(
        None, ge=1, description="Newer name of max_tokens; wins when both are given."
    )
    add_generation_prompt: bool = Field(
        True, description="End the templated prompt with the assistant turn header."
    )
    logprobs: bool | None = Field(None, description="Return the logprob of each generated token.")
    top_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description=f"With logprobs: also the N (0..{MAX_LOGPROBS}) most likely tokens at "
        "each position.",
    )

    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


def _is_neutral(value: Any, neutrals: tuple[Any, ...]) -> bool:
    # Compare types too: True == 1 in Python, but n=true is not n=1.
    return any(type(value) is type(v) and value == v for v in neutrals)


def find_unsupported_field(body: BaseModel) -> tuple[str, str] | None:
    """The first field of ``body`` that this server refuses, as ``(field, message)``.

    Refused: an OpenAI feature set to a non-neutral value, an unknown field, or
    ``stream_options`` without ``stream``.
    """
    extra = body.model_extra or {}
    for name, value in extra.items():
        if name in HARMLESS_FIELDS or value is None:
            continue
        if name in UNSUPPORTED_FIELDS:
            if _is_neutral(value, UNSUPPORTED_FIELDS[name]):
                continue
            reason = REFUSAL_REASONS.get(name, f"'{name}' is not supported by this server")
            return name, f"{reason} (got {name}={value!r})"
        return name, f"unknown field '{name}'"
    if isinstance(body, ChatCompletionRequest):
        for i, msg in enumerate(body.messages):
            for name in msg.model_extra or {}:
                return (
                    f"messages[{i}].{name}",
                    f"message field '{name}' is not supported (tool calls are not implemented)",
                )
    if isinstance(body, SamplingFields) and body.stream_options is not None and not body.stream:
        return "stream_options", "stream_options is only allowed with stream=true"
    return None


# ---------------------------------------------------------------------------------------------
# Responses


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class SpecDecodeInfo(BaseModel):
    """Per-request speculative decoding summary.

    Attributes:
        num_drafts: speculative steps in which at least one token was drafted.
        num_draft_tokens: tokens proposed over all drafts.
        num_accepted_tokens: proposed tokens the target accepted.
        acceptance_rate: num_accepted_tokens / num_draft_tokens (0 when nothing was drafted).
        mean_acceptance_length: tokens per verify step, 1 + accepted / drafts (bonus included).
    """

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    spec_decode: SpecDecodeInfo | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    spec_decode: SpecDecodeInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specserve"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
