"""Achieved load versus target, from the send/finish times of the measured requests.

Closed loop: achieved concurrency is the time-average number of requests in flight over the
*steady window* of each batch, from the send of its C-th request (all slots filled) to its
last send (after which slots drain). When no batch is long enough for such a window (e.g.
A/B batches of exactly C requests), the peak number in flight per batch is used instead.
Open loop: achieved rate = (sends − 1) / (last send − first send), per batch, pooled. A
Poisson schedule of a few requests has a realised rate far from the target by chance, so the
drift of an open loop is measured against the realised rate of the schedule (same formula on
the scheduled times): it is the client's lateness, not sampling noise; both rates are kept.
A run is flagged when |achieved / reference − 1| exceeds the spec's ``max_drift``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, Field

from specserve.bench.records import RequestRecord


class LoadCheck(BaseModel):
    """Target vs achieved load."""

    kind: str = Field(description="'concurrency' or 'rate'.")
    target: float
    achieved: float | None = Field(default=None, description="None when not measurable.")
    reference: float | None = Field(
        default=None, description="What drift is measured against: target, or the schedule's rate."
    )
    drift: float | None = Field(default=None, description="achieved / reference − 1.")
    flagged: bool = Field(default=False, description="|drift| > max_drift.")


def _in_flight_average(records: Sequence[RequestRecord], start: int, end: int) -> float:
    total = 0
    for r in records:
        done = r.done_ns if r.done_ns is not None else r.send_ns
        total += max(0, min(done, end) - max(r.send_ns, start))
    return total / (end - start)


def _peak(records: Sequence[RequestRecord]) -> int:
    events = sorted(
        [(r.send_ns, 1) for r in records]
        + [(r.done_ns if r.done_ns is not None else r.send_ns, -1) for r in records]
    )
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def check_load(
    records: Sequence[RequestRecord], kind: str, target: float, max_drift: float
) -> LoadCheck:
    batches: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if not r.warmup:
            batches[r.batch].append(r)
    weighted, weight, sched_weight = 0.0, 0.0, 0.0
    peaks: list[int] = []
    for recs in batches.values():
        sends = sorted(r.send_ns for r in recs)
        if kind == "concurrency":
            c = int(target)
            if len(sends) > c and sends[-1] > sends[c - 1]:
                start, end = sends[c - 1], sends[-1]
                weighted += _in_flight_average(recs, start, end) * (end - start)
                weight += end - start
            peaks.append(_peak(recs))
        elif len(sends) > 1 and sends[-1] > sends[0]:
            weighted += len(sends) - 1
            weight += (sends[-1] - sends[0]) / 1e9
            scheduled = sorted(r.scheduled_ns for r in recs)
            sched_weight += (scheduled[-1] - scheduled[0]) / 1e9
    if weight == 0 and peaks:
        weighted, weight = float(sum(peaks)), float(len(peaks))
    if weight == 0:
        return LoadCheck(kind=kind, target=target)
    achieved = weighted / weight
    reference = target if kind == "concurrency" or sched_weight == 0 else weighted / sched_weight
    drift = achieved / reference - 1
    return LoadCheck(
        kind=kind,
        target=target,
        achieved=achieved,
        reference=reference,
        drift=drift,
        flagged=abs(drift) > max_drift,
    )
