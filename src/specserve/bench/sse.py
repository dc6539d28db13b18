"""Incremental Server-Sent Events parser: bytes in (any split), complete ``data`` payloads out.

An event ends at a blank line; its ``data:`` lines are joined with newlines. Comments (``:``)
and ``event:``/``id:``/``retry:`` fields are ignored. One event may arrive over several TCP
reads, and one read may carry several events; an event is timed by the read completing it.
"""

from __future__ import annotations


class SSEParser:
    """Feed bytes with :meth:`feed`; get the payloads of the events they completed."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        events: list[str] = []
        while True:
            nl = self._buffer.find(b"\n")
            if nl < 0:
                return events
            line = self._buffer[:nl].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[nl + 1 :]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)

    def flush(self) -> list[str]:
        """Payload of a last event that the stream ended without a blank line after."""
        rest = self.feed(b"\n\n") if self._buffer or self._data else []
        return rest
