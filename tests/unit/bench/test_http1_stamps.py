"""The fast-path reader stamps data when it comes off the socket, not when it is parsed."""

from __future__ import annotations

import asyncio
import time

from specserve.bench.http1 import StampedStreamReader


def test_each_read_gets_the_arrival_of_its_own_last_byte() -> None:
    async def scenario() -> tuple[list[int | None], list[int]]:
        reader = StampedStreamReader(limit=1 << 16, loop=asyncio.get_running_loop())
        assert reader.consumed_arrival_ns() is None
        stamps = []
        for piece in (b"data: one\n\n", b"data: two\n\n", b"data: three\n\n"):
            reader.feed_data(piece)
            stamps.append(time.perf_counter_ns())  # just after this piece's own stamp
            await asyncio.sleep(0.01)
        seen = []
        # Parsed only now, long after all three arrived: each read still maps to its piece.
        for _ in range(3):
            await reader.readuntil(b"\n\n")
            seen.append(reader.consumed_arrival_ns())
        return seen, stamps

    seen, stamps = asyncio.run(scenario())
    assert all(s is not None for s in seen)
    first, second, third = (int(s) for s in seen if s is not None)
    assert first <= stamps[0] < second <= stamps[1] < third <= stamps[2]
    assert stamps[1] - first >= 5_000_000  # not the time of the later pieces


def test_a_read_spanning_two_feeds_takes_the_later_one() -> None:
    async def scenario() -> tuple[int | None, int]:
        reader = StampedStreamReader(limit=1 << 16, loop=asyncio.get_running_loop())
        reader.feed_data(b"data: sp")
        between = time.perf_counter_ns()
        await asyncio.sleep(0.005)
        reader.feed_data(b"lit\n\n")
        await reader.readuntil(b"\n\n")
        return reader.consumed_arrival_ns(), between

    arrival, between = asyncio.run(scenario())
    assert arrival is not None and arrival > between
