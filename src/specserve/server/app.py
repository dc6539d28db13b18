"""The FastAPI app: routes, readiness, lifespan (model loading and draining shutdown).

Startup order (chosen so orchestrators can tell "alive" from "ready"): the app binds and
answers ``/health`` immediately, while a worker thread calls the engine factory (``serve``'s
factory, ``AsyncEngine.from_config``, loads the models on the engine's own step thread and
returns once they are loaded). Until the model is loaded ``/v1/models`` and ``/ready`` answer
503 and generation requests get 503, so a Kubernetes startup/readiness probe should poll
``/v1/models`` (or ``/ready``) and a liveness probe ``/health``. If loading fails,
``on_load_failure`` is called (the ``serve`` command then exits non-zero).

Shutdown (SIGTERM under uvicorn): the listener closes, in-flight requests run to completion,
then the lifespan marks the state draining and shuts the engine down with ``drain=True``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from specserve.server.engine_client import EngineClient
from specserve.server.errors import ServiceUnavailableError, install_error_handlers
from specserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    now_s,
)
from specserve.server.serving_chat import create_chat_completion
from specserve.server.serving_completions import create_completion
from specserve.server.state import ServerState

logger = logging.getLogger(__name__)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def create_app(
    *,
    served_model_name: str,
    engine: EngineClient | None = None,
    engine_factory: Callable[[], EngineClient] | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
    shutdown_engine: bool = True,
) -> FastAPI:
    """Build the OpenAI-compatible app around an engine.

    Args:
        served_model_name: the name clients put in ``model`` (the engine's own
            ``model_name`` is accepted too).
        engine: an engine that is already loaded (tests, embedding).
        engine_factory: builds the engine; called from a worker thread at startup.
        on_load_failure: called with the exception if ``engine_factory`` fails.
        shutdown_engine: shut the engine down (draining) when the app stops.
    """
    if (engine is None) == (engine_factory is None):
        raise ValueError("pass exactly one of engine and engine_factory")
    state = ServerState(served_model_name)
    if engine is not None:
        state.set_engine(engine)

    async def load() -> None:
        assert engine_factory is not None
        try:
            built = await asyncio.to_thread(engine_factory)
        except Exception as exc:
            state.load_error = f"{type(exc).__name__}: {exc}"
            logger.exception("model failed to load")
            if on_load_failure is not None:
                on_load_failure(exc)
            return
        state.set_engine(built)
        logger.info("model loaded; serving %r", served_model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(load()) if engine_factory is not None else None
        try:
            yield
        finally:
            state.draining = True
            if loader is not None and not loader.done():
                loader.cancel()  # the worker thread itself cannot be interrupted
            loaded = state.loaded_engine
            if shutdown_engine and loaded is not None:
                await loaded.shutdown(drain=True)
            logger.info("server stopped")

    app = FastAPI(title="specserve", lifespan=lifespan)
    app.state.server = state
    app.state.metrics = state.metrics
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        """Liveness: 200 while the process runs (503 only if the model failed to load)."""
        if state.load_error is not None:
            raise ServiceUnavailableError(f"model failed to load: {state.load_error}")
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 200 once the model is loaded and the server is not draining."""
        state.engine  # noqa: B018 -- raises 503 while loading or draining
        return JSONResponse({"status": "ready", "model": served_model_name})

    @app.get("/v1/models")
    async def models() -> ModelList:
        engine = state.engine  # 503 until loaded: startup probes poll this
        card = ModelCard(
            id=served_model_name,
            created=now_s(),
            root=engine.model_name,
            max_model_len=engine.max_model_len,
        )
        return ModelList(data=[card])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await create_completion(body, raw, state)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await create_chat_completion(body, raw, state)

    return app
