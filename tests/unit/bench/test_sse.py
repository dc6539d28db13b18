"""SSE parsing: events split over reads, several per read, CRLF, comments, multi-line data."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specserve.bench.sse import SSEParser

STREAM = b'data: {"a": 1}\n\n: keep-alive comment\n\nevent: x\ndata: {"b": 2}\n\ndata: [DONE]\n\n'


def test_one_read_many_events() -> None:
    assert SSEParser().feed(STREAM) == ['{"a": 1}', '{"b": 2}', "[DONE]"]


def test_byte_by_byte_gives_same_events_and_completes_at_last_byte() -> None:
    parser = SSEParser()
    seen: list[tuple[int, str]] = []
    for i in range(len(STREAM)):
        seen += [(i, e) for e in parser.feed(STREAM[i : i + 1])]
    assert [e for _, e in seen] == ['{"a": 1}', '{"b": 2}', "[DONE]"]
    # an event is complete only when its blank line arrives
    assert seen[0][0] == STREAM.index(b"\n\n") + 1


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM)), max_size=8))
def test_any_split_gives_same_events(cuts: list[int]) -> None:
    parser, events, prev = SSEParser(), [], 0
    for cut in [*sorted(set(cuts)), len(STREAM)]:
        events += parser.feed(STREAM[prev:cut])
        prev = cut
    assert events == ['{"a": 1}', '{"b": 2}', "[DONE]"]


def test_crlf_and_multiline_data_and_no_space() -> None:
    raw = b"data:first\r\ndata: second\r\n\r\ndata: x\n\n"
    assert SSEParser().feed(raw) == ["first\nsecond", "x"]


def test_flush_returns_unterminated_last_event() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]") == []
    assert parser.flush() == ["[DONE]"]
    assert SSEParser().flush() == []
