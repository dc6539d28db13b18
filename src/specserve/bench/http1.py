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
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPProtocolError(Exception):
    """The server broke HTTP/1.1 framing (or closed the connection mid-response)."""


class Response:
    """Status, headers, and a body iterator yielding data as it arrives."""

    def __init__(self, status: int, headers: dict[str, str], body: AsyncIterator[bytes]) -> None:
        self.status = status
        self.headers = headers
        self._body = body

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
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=1 << 22), self.timeout_s
        )
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
        return Response(status, headers, self._body(reader, writer, headers))

    async def _body(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]
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
