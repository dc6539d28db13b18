"""The quality check asks one arm a window of items at once, never both arms together, and
pairs every answer with its own item."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specserve.quality.client import ArmEndpoint
from specserve.quality.config import QualityConfig
from specserve.quality.run import run_quality


class _Log:
    """Request intervals (arm, start, end) of every server, on one clock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.intervals: list[tuple[str, float, float]] = []


@contextmanager
def _echo_server(arm: str, log: _Log, delay_s: float) -> Iterator[str]:
    """A chat server that answers each request with its own user message after ``delay_s``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            start = time.monotonic()
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delay_s)
            reply = {
                "choices": [
                    {
                        "message": {"content": body["messages"][-1]["content"]},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"completion_tokens": 3},
            }
            data = json.dumps(reply).encode()
            with log.lock:
                log.intervals.append((arm, start, time.monotonic()))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("concurrency", [1, 3])
def test_windows_of_one_arm_at_a_time(concurrency: int) -> None:
    log = _Log()
    cfg = QualityConfig(humaneval=None, exact={"count": 7}, concurrency=concurrency)
    with _echo_server("a", log, 0.15) as a, _echo_server("b", log, 0.15) as b:
        report = run_quality(cfg, {"a": ArmEndpoint(a, "m"), "b": ArmEndpoint(b, "m")})
    (task,) = report.tasks
    # Every answer belongs to its own item (the servers echo the question), in item order.
    assert [r.item_id for r in task.records] == [f"exact/{i}" for i in range(7)]
    for r in task.records:
        assert r.answers["a"].text == r.answers["b"].text == r.prompt
        assert r.identical
    by_arm = {arm: [(s, e) for x, s, e in log.intervals if x == arm] for arm in "ab"}
    assert len(by_arm["a"]) == len(by_arm["b"]) == 7
    # Each arm had a whole window in flight; the two arms never ran at the same time.
    assert _max_overlap(by_arm["a"]) == _max_overlap(by_arm["b"]) == concurrency
    assert _max_overlap([(s, e) for _, s, e in log.intervals]) == concurrency


def test_concurrency_is_bounded() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        QualityConfig(concurrency=0)
