"""A minimal HTTP/1.1 client over asyncio streams, for the streaming hot path.

Why not httpx here: per SSE chunk, httpx/httpcore/h11/anyio cost a few hundred microseconds
of Python, which at thousands of chunks per second makes the client the bottleneck and adds
queueing delay to every timestamp. This client does only what a POST with a streamed answer
needs: keep-alive connections pooled per host, ``Content-Length`` request bodies, chunked or
length-delimited or close-delimited response bodies. Plain ``http://`` only (the caller uses
httpx for ``https://``).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import SupportsIndex
from urllib.parse import urlsplit


class HTTPProtocolError(Exception):
    """The server broke HTTP/1.1 framing (or closed the connection mid-response)."""


class StampedStreamReader(asyncio.StreamReader):
    """A stream reader that remembers when each piece of data came off the socket.

    ``feed_data`` runs in the event loop's read callback, before any coroutine parses the
    data, so its ``perf_counter_ns()`` is the arrival time without the client's own queueing
    (a burst of chunks from many streams is stamped in one sweep, then parsed one by one).
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self._fed = 0  # bytes fed so far
        self._feeds: deque[tuple[int, int]] = deque()  # (end offset, arrival ns) per feed

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if data:
            self._fed += len(data)  # type: ignore[arg-type]  # the protocol feeds bytes
            self._feeds.append((self._fed, time.perf_counter_ns()))
        super().feed_data(data)

    def consumed_arrival_ns(self) -> int | None:
        """Arrival time of the last byte read so far (None before any data)."""
        consumed = self._fed - len(self._buffer)  # type: ignore[attr-defined]
        while len(self._feeds) > 1 and self._feeds[0][0] < consumed:
            self._feeds.popleft()
        return self._feeds[0][1] if self._feeds else None


class Response:
    """Status, headers, and a body iterator yielding data as it arrives."""

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        body: AsyncIterator[bytes],
        reader: StampedStreamReader | None = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self._body = body
        self._reader = reader

    def arrival_ns(self) -> int | None:
        """``perf_counter_ns()`` at which the data last yielded came off the socket."""
        return None if self._reader is None else self._reader.consumed_arrival_ns()

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._body

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self._body])


class Http1Pool:
    """Keep-alive connections to one ``http://host:port`` origin; safe for many tasks."""

    def __init__(self, root_url: str, timeout_s: float) -> None:
        parts = urlsplit(root_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"Http1Pool needs an http:// URL, got {root_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self._idle: list[tuple[StampedStreamReader, asyncio.StreamWriter]] = []

    async def _connect(self) -> tuple[StampedStreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        loop = asyncio.get_running_loop()
        reader = StampedStreamReader(limit=1 << 22, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        async with asyncio.timeout(self.timeout_s):
            transport, _ = await loop.create_connection(lambda: protocol, self.host, self.port)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    async def post(self, path: str, body: bytes) -> Response:
        """Send a JSON POST; the response body must be consumed (or the request abandoned)."""
        reader, writer = await self._connect()
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
        ).encode()
        writer.write(head + body)
        try:
            await writer.drain()
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
        except BaseException:
            writer.close()
            raise
        lines = raw.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as e:
            writer.close()
            raise HTTPProtocolError(f"bad status line {lines[0]!r}") from e
        headers = {
            k.strip().lower(): v.strip()
            for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
        }
        return Response(status, headers, self._body(reader, writer, headers), reader)

    async def _body(
        self, reader: StampedStreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]
    ) -> AsyncIterator[bytes]:
        reusable = False
        try:
            timeout = self.timeout_s
            if "chunked" in headers.get("transfer-encoding", "").lower():
                # asyncio.timeout (not wait_for, which wraps every read in a new Task on
                # 3.11) keeps the per-chunk cost low; it never spans a yield, so a deadline
                # cannot fire while the consumer is elsewhere.
                while True:
                    async with asyncio.timeout(timeout):
                        size_line = await reader.readuntil(b"\r\n")
                        try:
                            size = int(size_line.split(b";", 1)[0].strip(), 16)
                        except ValueError as e:
                            raise HTTPProtocolError(f"bad chunk size {size_line!r}") from e
                        if size == 0:
                            while await reader.readuntil(b"\r\n") != b"\r\n":
                                pass  # trailers
                            break
                        data = await reader.readexactly(size + 2)
                    yield data[:-2]
                reusable = True
            elif "content-length" in headers:
                left = int(headers["content-length"])
                while left > 0:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(min(left, 1 << 20))
                    if not data:
                        raise HTTPProtocolError("connection closed before the body's end")
                    left -= len(data)
                    yield data
                reusable = True
            else:  # delimited by connection close
                while True:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(1 << 16)
                    if not data:
                        break
                    yield data
        except asyncio.IncompleteReadError as e:
            raise HTTPProtocolError("connection closed mid-response") from e
        finally:
            if reusable and headers.get("connection", "").lower() != "close":
                self._idle.append((reader, writer))
            else:
                writer.close()
