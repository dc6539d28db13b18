"""Server-Sent Events framing and the streaming response that always releases its request.

Framing: each event is ``data: <json>\\n\\n``; the stream ends with ``data: [DONE]\\n\\n``.
One event per engine step: a chunk may carry several tokens under speculation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from specserve.server.errors import APIError
from specserve.server.request_run import RequestRun

DONE_EVENT = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(chunk: BaseModel) -> bytes:
    """One SSE ``data:`` event; ``spec_decode`` is left out of chunks that have none."""
    exclude = {"spec_decode"} if getattr(chunk, "spec_decode", None) is None else None
    return b"data: " + chunk.model_dump_json(exclude=exclude).encode() + b"\n\n"


def sse_error_event(err: APIError) -> bytes:
    """An error reported inside an already started stream (headers are sent: no status)."""
    return b"data: " + err.to_response().model_dump_json().encode() + b"\n\n"


class RunStreamingResponse(StreamingResponse):
    """A streaming response that closes its :class:`RequestRun` however the response ends
    (finished, client gone before the first byte, or cancelled), so the engine request is
    aborted and its KV blocks freed."""

    def __init__(self, content: AsyncIterator[bytes], run: RequestRun) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._run.close()
