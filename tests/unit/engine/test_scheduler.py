"""Scheduler: token budget, chunked prefill, per-request k, preemption order, queue bound."""

from __future__ import annotations

import pytest

from specserve.config import SchedulerConfig
from specserve.engine.errors import QueueFullError
from specserve.engine.request import Request, RequestStatus
from specserve.engine.scheduler import Scheduler, SchedulerOutput
from specserve.kv_cache.kv_manager import KVCacheManager
from specserve.sampling_params import SamplingParams


class FixedK:
    """k chooser returning a fixed k and recording the batch sizes it was shown."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.batch_sizes: list[int] = []

    def choose_k(self, request_id: str, batch_size: int) -> int:
        self.batch_sizes.append(batch_size)
        return self.k


def make_request(rid: str, n: int, t: float, max_tokens: int = 50) -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens), max_tokens,
                   arrival_time=t)  # fmt: skip


def complete_step(sched: Scheduler, out: SchedulerOutput, accept_drafts: int = 0) -> None:
    """What the engine does after a step: advance computed tokens, append a sampled token."""
    for sr in out.scheduled:
        req = sr.request
        samples = sr.samples
        req.num_computed_tokens += sr.num_new_tokens
        if samples:
            accepted = min(accept_drafts, sr.num_lookahead)
            req.token_ids += [5] * (accepted + 1)
            req.num_computed_tokens += accepted
        sched.kv.commit(req.request_id, req.token_ids, req.num_computed_tokens)
    sched.kv.check_invariants()


def test_chunked_prefill_respects_token_budget() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16), kv)
    sched.add(make_request("a", 40, 0.0))
    sched.add(make_request("b", 3, 1.0))
    chunks = []
    for _ in range(3):
        out = sched.schedule()
        assert out.num_batched_tokens <= 16
        chunks.append([(s.request.request_id, s.num_new_tokens, s.samples) for s in out.scheduled])
        complete_step(sched, out)
    assert chunks[0] == [("a", 16, False)]
    assert chunks[1] == [("a", 16, False)]
    # a's last 8 tokens, then b fills the rest of the budget.
    assert chunks[2] == [("a", 8, True), ("b", 3, True)]


def test_decode_gets_k_lookahead_capped_by_budget_and_output_room() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4)
    chooser = FixedK(7)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16), kv, chooser, max_lookahead=7)
    sched.add(make_request("a", 4, 0.0, max_tokens=50))
    sched.add(make_request("b", 4, 1.0, max_tokens=3))
    complete_step(sched, sched.schedule())  # prefill both, one token each
    out = sched.schedule()
    ks = {s.request.request_id: s.num_lookahead for s in out.scheduled}
    # b may produce 2 more tokens: k + 1 <= 2. a gets 7 (1 + 7 = 8 of the 16 budget).
    assert ks == {"a": 7, "b": 1}
    assert chooser.batch_sizes == [2, 2]
    assert out.num_batched_tokens == 8 + 2
    assert kv.num_reserved("a") == 8


def test_drafting_is_disabled_from_the_batch_size_limit_on() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4)
    chooser = FixedK(3)
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64), kv, chooser, 3, disable_by_batch_size=2
    )
    sched.add(make_request("a", 4, 0.0))
    complete_step(sched, sched.schedule())
    assert [s.num_lookahead for s in sched.schedule().scheduled] == [3]  # alone: drafts
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64), kv, chooser, 3, disable_by_batch_size=2
    )
    own_k = Request("c", [1, 2, 3, 4], SamplingParams(max_tokens=50, num_speculative_tokens=2),
                    50, arrival_time=2.0)  # fmt: skip
    for req in (make_request("b", 4, 1.0), own_k):
        sched.add(req)
    complete_step(sched, sched.schedule())
    ks = {s.request.request_id: s.num_lookahead for s in sched.schedule().scheduled}
    assert ks == {"b": 0, "c": 2}  # batch of 2: off, except for a request's own k


def test_preempts_newest_first_and_recomputes_later() -> None:
    kv = KVCacheManager(num_blocks=7, block_size=4)  # 6 usable blocks = 24 slots
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), kv)
    for i, rid in enumerate(["a", "b", "c"]):
        sched.add(make_request(rid, 8, float(i)))  # 2 blocks each: the pool is full
    out = sched.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["a", "b", "c"]
    complete_step(sched, out)  # each now has 9 tokens, 8 computed
    out = sched.schedule()  # a and b need a 3rd block each; freeing c (newest) suffices
    assert [r.request_id for r in out.preempted] == ["c"]
    assert [s.request.request_id for s in out.scheduled] == ["a", "b"]
    c = out.preempted[0]
    assert c.status is RequestStatus.WAITING and c.num_computed_tokens == 0
    assert c.num_preemptions == 1 and sched.waiting[0] is c
    assert c.request_id not in kv.block_tables
    complete_step(sched, out)
    # c keeps its sampled token and is recomputed (prompt + output) once blocks free up.
    sched.finish(sched.running[0], "stop")
    out = sched.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["b", "c"]
    c_row = out.scheduled[1]
    assert c_row.num_new_tokens + c.num_computed_tokens == 9 and c_row.samples
    kv.check_invariants()


def test_request_that_cannot_fit_preempts_itself_not_older_ones() -> None:
    kv = KVCacheManager(num_blocks=5, block_size=4)  # 16 slots
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), kv)
    sched.add(make_request("a", 5, 0.0))
    sched.add(make_request("b", 7, 1.0))
    complete_step(sched, sched.schedule())  # 2 blocks each: the pool is full
    complete_step(sched, sched.schedule())
    out = sched.schedule()  # b now needs a 3rd block; a does not: b preempts itself
    assert [r.request_id for r in out.preempted] == ["b"]
    assert [s.request.request_id for s in out.scheduled] == ["a"]
    assert [r.request_id for r in sched.running] == ["a"]
    assert [r.request_id for r in sched.waiting] == ["b"]
    kv.check_invariants()


def test_lookahead_dropped_before_preempting() -> None:
    kv = KVCacheManager(num_blocks=5, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), kv, FixedK(6), 6)
    sched.add(make_request("a", 7, 0.0))
    sched.add(make_request("b", 7, 1.0))
    complete_step(sched, sched.schedule())
    out = sched.schedule()
    # a's 6 lookahead slots would need a 3rd block which b holds: k drops to 0 instead.
    assert [(s.request.request_id, s.num_lookahead) for s in out.scheduled] == [
        ("a", 0),
        ("b", 0),
    ]
    assert not out.preempted


def test_queue_bound_and_max_num_seqs() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_queue_len=3), kv)
    for i in range(3):
        sched.add(make_request(f"r{i}", 4, float(i)))
    with pytest.raises(QueueFullError, match="max_queue_len=3"):
        sched.add(make_request("r3", 4, 3.0))
    out = sched.schedule()
    assert len(out.scheduled) == 2 and len(sched.waiting) == 1
    sched.add(make_request("r3", 4, 3.0))  # room in the queue again


def test_finish_frees_blocks_of_waiting_and_running() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=1), kv)
    a, b = make_request("a", 5, 0.0), make_request("b", 5, 1.0)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    sched.finish(a, "abort")
    sched.finish(b, "abort")
    assert not sched.has_unfinished()
    assert kv.pool.num_used_blocks == 0
