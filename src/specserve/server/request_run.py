"""One request's trip through the engine, as the HTTP handlers see it.

:class:`RequestRun` owns the engine stream of one request. It

* waits for the first output before the handler answers, so that a full queue (429) or a
  prompt the engine refuses (400) becomes a proper status code even for ``stream=true``;
* watches the client connection the whole time and aborts the engine request when the
  client goes away (so its KV blocks are freed), before or during streaming;
* measures time to first token and end-to-end latency and records them once, when the
  request finishes or is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request

from specserve.engine.errors import EngineDeadError, EngineShutdownError, QueueFullError
from specserve.sampling_params import SamplingParams
from specserve.server.engine_client import EngineClient, EngineOutput
from specserve.server.errors import BadRequestError, ServiceUnavailableError, TooManyRequestsError
from specserve.server.metrics import RequestMetrics
from specserve.server.protocol import SpecDecodeInfo

logger = logging.getLogger(__name__)


class ClientDisconnected(Exception):
    """The HTTP client closed the connection before the response was complete."""


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has disconnected (the request body must already be read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def engine_error_to_api(exc: Exception) -> Exception:
    """Map what ``engine.generate`` raises to the server's HTTP errors."""
    if isinstance(exc, QueueFullError):
        return TooManyRequestsError(f"server is at its queue bound, retry later ({exc})")
    if isinstance(exc, EngineShutdownError | EngineDeadError):
        return ServiceUnavailableError(f"engine is not accepting requests ({exc})")
    if isinstance(exc, ValueError):
        return BadRequestError(str(exc))
    return exc


def spec_info(output: EngineOutput) -> SpecDecodeInfo | None:
    """The per-request speculative summary of a (final) output, if it speculated at all."""
    s = output.spec
    if s is None:
        return None
    return SpecDecodeInfo(
        num_drafts=s.num_drafts,
        num_draft_tokens=s.num_draft_tokens,
        num_accepted_tokens=s.num_accepted_tokens,
        acceptance_rate=s.num_accepted_tokens / s.num_draft_tokens if s.num_draft_tokens else 0.0,
        mean_acceptance_length=float(s.mean_acceptance_length),
    )


class RequestRun:
    """Drives ``engine.generate`` for one HTTP request (see the module docstring)."""

    def __init__(
        self,
        engine: EngineClient,
        metrics: RequestMetrics,
        request: Request,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_s: float,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.request = request
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_s = arrival_s  # time.perf_counter() when the request arrived
        self.first_token_s: float | None = None
        self.last: EngineOutput | None = None
        self._stream: AsyncIterator[EngineOutput] | None = None
        self._disconnect: asyncio.Task[None] | None = None
        self._recorded = False

    async def _next(self) -> EngineOutput | None:
        """Next engine output, None at the end; raises ClientDisconnected if the client left."""
        assert self._stream is not None and self._disconnect is not None
        nxt: asyncio.Task[Any] = asyncio.ensure_future(anext(self._stream, None))
        try:
            done, _ = await asyncio.wait(
                {nxt, self._disconnect}, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            nxt.cancel()
            raise
        if nxt not in done:
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
            raise ClientDisconnected
        out: EngineOutput | None = nxt.result()
        if out is not None:
            if self.first_token_s is None and out.num_generated_tokens > 0:
                self.first_token_s = time.perf_counter()
            self.last = out
        return out

    async def first(self) -> EngineOutput:
        """Start the request and wait for its first output; engine refusals become
        HTTP errors here."""
        self._disconnect = asyncio.ensure_future(wait_for_disconnect(self.request))
        self._stream = aiter(
            self.engine.generate(self.request_id, self.prompt_token_ids, self.params)
        )
        try:
            out = await self._next()
        except ClientDisconnected:
            await self.close()
            raise
        except Exception as exc:
            await self.close(record=False)
            raise engine_error_to_api(exc) from exc
        except BaseException:
            await self.close()
            raise
        if out is None:
            await self.close(record=False)
            raise RuntimeError(f"engine ended request {self.request_id} without output")
        return out

    async def rest(self) -> AsyncIterator[EngineOutput]:
        """The outputs after :meth:`first`, until the finished one."""
        try:
            while self.last is not None and not self.last.finished:
                out = await self._next()
                if out is None:
                    raise RuntimeError(f"engine stream of {self.request_id} ended unfinished")
                yield out
        finally:
            await self.close()

    async def close(self, record: bool = True) -> None:
        """Abort the engine request if unfinished, stop watching, record metrics once.

        Shielded: this runs while the handler may be cancelled (client gone)."""
        with anyio.CancelScope(shield=True):
            finished = self.last is not None and self.last.finished
            if self._disconnect is not None:
                self._disconnect.cancel()
            if self._stream is not None and not finished:
                try:
                    await self.engine.abort(self.request_id)
                except Exception:
                    logger.exception("abort of %s failed", self.request_id)
            aclose = getattr(self._stream, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            if record and not self._recorded and self._stream is not None:
                self._recorded = True
                last = self.last
                self.metrics.observe_finished(
                    num_prompt_tokens=len(self.prompt_token_ids),
                    num_generated_tokens=last.num_generated_tokens if last else 0,
                    finish_reason=(last.finish_reason or "abort") if finished and last else "abort",
                    ttft_s=None if self.first_token_s is None
                    else self.first_token_s - self.arrival_s,
                    e2e_s=time.perf_counter() - self.arrival_s,
                )  # fmt: skip
