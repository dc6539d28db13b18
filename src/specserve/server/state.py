"""What one server app holds: the engine (once loaded), its names, metrics and readiness.

Terms:
    live: the process answers HTTP (``/health`` is 200 from the first moment).
    ready: the model is loaded and requests are accepted (``/v1/models``, ``/ready``).
    draining: shutdown started; new generation requests get 503, in-flight ones finish.
"""

from __future__ import annotations

from typing import Any

from specserve.engine.outputs import EngineStats
from specserve.server.engine_client import EngineClient
from specserve.server.errors import (
    BadRequestError,
    ServiceUnavailableError,
    UnknownModelError,
)
from specserve.server.metrics import ServerMetrics


class ServerState:
    """Shared by the handlers of one app (``app.state.server``)."""

    def __init__(self, served_model_name: str) -> None:
        self.served_model_name = served_model_name
        self._engine: EngineClient | None = None
        self.load_error: str | None = None
        self.draining = False
        self.metrics = ServerMetrics(served_model_name, self.engine_stats)

    @property
    def ready(self) -> bool:
        return self._engine is not None and not self.draining

    def set_engine(self, engine: EngineClient) -> None:
        """Make ``engine`` the served engine and subscribe to its per-step statistics."""
        inner = getattr(engine, "engine", engine)  # AsyncEngine wraps the stepping LLMEngine
        add_listener = getattr(inner, "add_step_listener", None)
        if add_listener is not None:
            add_listener(self.metrics.steps.observe_step)
        self._engine = engine

    @property
    def engine(self) -> EngineClient:
        """The engine; 503 while loading or draining."""
        if self._engine is None:
            reason = f"model failed to load: {self.load_error}" if self.load_error else None
            raise ServiceUnavailableError(reason or "model is still loading, retry later")
        if self.draining:
            raise ServiceUnavailableError("server is shutting down")
        return self._engine

    @property
    def loaded_engine(self) -> EngineClient | None:
        """The engine if loaded, draining or not (for shutdown and metrics)."""
        return self._engine

    @property
    def vocab_size(self) -> int:
        """Token ids the model accepts (its embedding rows; may exceed the tokenizer's)."""
        return int(self.engine.arch.vocab_size)

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer; 400 for text input to a token-id-only engine."""
        tok = self.engine.tokenizer
        if tok is None:
            raise BadRequestError("this engine has no tokenizer; send token ids as the prompt")
        return tok

    def check_model(self, model: str) -> None:
        """404 unless ``model`` names the served model."""
        names = {self.served_model_name}
        if self._engine is not None:
            names.add(self._engine.model_name)
        if model not in names:
            raise UnknownModelError(
                f"the model '{model}' does not exist; this server serves "
                f"'{self.served_model_name}'",
                param="model",
            )

    def engine_stats(self) -> EngineStats | None:
        if self._engine is None:
            return None
        stats: EngineStats = self._engine.stats()
        return stats
