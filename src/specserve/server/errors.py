"""The one place where exceptions become HTTP responses.

Every error body is OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.

========================================================  ======  =====================
condition                                                 status  type
========================================================  ======  =====================
invalid JSON, wrong types, out-of-range values, unknown   400     invalid_request_error
or unsupported fields, empty prompt, prompt or
max_tokens beyond the context
unknown model, unknown route                              404     not_found_error
wrong method on a route                                   405     invalid_request_error
waiting queue full                                        429     rate_limit_error
model still loading, server shutting down                 503     service_unavailable
anything else (a bug)                                     500     internal_error
========================================================  ======  =====================

Validation errors are 400 (not FastAPI's default 422), as vLLM and OpenAI answer them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specserve.server.protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)


class APIError(Exception):
    """An error with a defined HTTP status and OpenAI error body."""

    status_code = 500
    error_type = "internal_error"
    code: str | None = None

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(
                message=self.message, type=self.error_type, param=self.param, code=self.code
            )
        )


class BadRequestError(APIError):
    """The request is malformed or asks for something this server cannot do."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "bad_request"


class UnsupportedFieldError(BadRequestError):
    """An OpenAI feature this server does not implement was requested."""

    code = "unsupported_field"


class ContextLengthError(BadRequestError):
    """Prompt plus requested output does not fit in the model's context."""

    code = "context_length_exceeded"


class UnknownModelError(APIError):
    """The request names a model this server does not serve."""

    status_code = 404
    error_type = "not_found_error"
    code = "model_not_found"


class TooManyRequestsError(APIError):
    """The engine's waiting queue is at its bound; the client should retry later."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "queue_full"


class ServiceUnavailableError(APIError):
    """The model is not loaded yet, or the server is draining for shutdown."""

    status_code = 503
    error_type = "service_unavailable"
    code = "service_unavailable"


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.to_response().model_dump(), status_code=err.status_code)


def _format_loc(loc: Sequence[Any]) -> str:
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def validation_error(exc: RequestValidationError) -> BadRequestError:
    """Turn FastAPI's validation error into a 400 naming the first bad field."""
    errors = exc.errors()
    if not errors:
        return BadRequestError("invalid request body")
    first = errors[0]
    loc = list(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return BadRequestError(f"invalid JSON body: {first.get('msg', '')}", param=None)
    param = _format_loc(loc[:2]) if len(loc) >= 2 else None
    where = _format_loc(loc) or "body"
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return BadRequestError(f"{where}: {first.get('msg', 'invalid value')}{more}", param=param)


def _count_rejection(request: Request, reason: str) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.count_rejected(reason)


def install_error_handlers(app: FastAPI) -> None:
    """Register the exception → HTTP map on ``app``."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        if isinstance(exc, BadRequestError):
            _count_rejection(request, "bad_request")
        elif isinstance(exc, TooManyRequestsError):
            _count_rejection(request, "queue_full")
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        _count_rejection(request, "bad_request")
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = APIError(str(exc.detail))
        err.status_code = exc.status_code
        err.error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        err.code = str(exc.status_code)
        return error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(APIError(f"internal error: {type(exc).__name__}: {exc}"))
