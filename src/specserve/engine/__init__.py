"""Request state, scheduler (continuous batching), model runner, engine step, async façade.

``AsyncEngine``, ``LLMEngine``, ``RequestOutput``, ``EngineStats``, ``QueueFullError``,
``EngineShutdownError`` and ``EngineDeadError`` are importable from here; they load lazily so
that ``spec/`` can import ``engine.sampler`` without pulling in the engine (and back).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncEngine": "specserve.engine.async_engine",
    "EngineDeadError": "specserve.engine.async_engine",
    "EngineShutdownError": "specserve.engine.async_engine",
    "LLMEngine": "specserve.engine.llm_engine",
    "RequestOutput": "specserve.engine.outputs",
    "EngineStats": "specserve.engine.outputs",
    "SpecRequestSummary": "specserve.engine.outputs",
    "QueueFullError": "specserve.engine.request",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
