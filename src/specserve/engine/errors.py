"""What the engine raises when it does not take a request; the server maps each to a status.

A leaf of ``engine/``: the scheduler, the async façade and the server's error map import
these types from here (matched by type, never by name).
"""

from __future__ import annotations


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; the request was not admitted (HTTP 429)."""


class EngineShutdownError(RuntimeError):
    """The engine is shutting down and accepts no new requests (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The step loop failed; the engine serves nothing more (HTTP 503)."""
