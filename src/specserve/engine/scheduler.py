"""Continuous batching: which requests run in the next step, with how many tokens each.

Each step the scheduler fills a token budget (``SchedulerConfig.max_num_batched_tokens``):

1. Running requests first, oldest first. A decoding request takes 1 token plus ``k`` lookahead
   slots for its draft, k chosen per request by the k chooser (which sees the batch size); a
   request still in prefill takes the next chunk of its prompt that fits (chunked prefill).
2. If KV blocks run out, the *newest* running request is preempted (its blocks are freed and
   it goes back to the front of the waiting queue, to be recomputed later), repeatedly, until
   the older request fits. A request that would need to preempt itself is preempted instead.
   Before preempting anyone, a request drops its lookahead (k = 0).
3. Waiting requests are then admitted in arrival order while seats (``max_num_seqs``), budget
   and blocks remain, reusing prefix-cache blocks (except a request that wants its prompt
   logprobs: every position of its prompt must be computed); none is admitted in a step that
   preempted.

The scheduler moves no tensors; the runner turns its output into a batch.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from specserve.config import SchedulerConfig
from specserve.engine.errors import QueueFullError
from specserve.engine.request import Request, RequestStatus
from specserve.kv_cache.kv_manager import KVCacheManager


class KChooser(Protocol):
    """Picks the draft length of one decoding request (see ``spec_decode/k_controller.py``)."""

    def choose_k(self, request_id: str, batch_size: int) -> int: ...


@dataclass
class ScheduledRequest:
    """One request's share of a step.

    Attributes:
        request: the request.
        num_new_tokens: committed tokens run this step, starting at position
            ``request.num_computed_tokens`` (a prefill chunk, or 1 when decoding).
        num_lookahead: slots reserved for draft tokens (the k chosen; 0 = plain step).
    """

    request: Request
    num_new_tokens: int
    num_lookahead: int = 0

    @property
    def samples(self) -> bool:
        """The step reaches the request's last committed token, so it samples a new one."""
        req = self.request
        return req.num_computed_tokens + self.num_new_tokens == req.num_tokens


@dataclass
class SchedulerOutput:
    """The plan of one step.

    Attributes:
        scheduled: requests that run, oldest first.
        preempted: requests that lost their blocks this step (release their draft state).
        num_batched_tokens: committed tokens plus lookahead slots scheduled.
    """

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    num_batched_tokens: int = 0


def _arrival(req: Request) -> float:
    return req.arrival_time


class Scheduler:
    """Waiting queue, running set and the per-step plan.

    Attributes:
        waiting: requests not holding blocks, front first (preempted ones go to the front).
        running: requests holding blocks, ordered by arrival (the last is the newest).
        max_lookahead: most draft slots any request may reserve in one step.
        disable_by_batch_size: from this many requests in a step on, nobody drafts (unless a
            request asked for its own k): large batches are compute bound, so verifying
            drafts costs more than it saves (vLLM's ``disable_by_batch_size``).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        k_chooser: KChooser | None = None,
        max_lookahead: int = 0,
        disable_by_batch_size: int | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.k_chooser = k_chooser
        self.max_lookahead = max_lookahead
        self.disable_by_batch_size = disable_by_batch_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        """Queue a new request.

        Raises:
            QueueFullError: ``max_queue_len`` requests are already waiting.
        """
        if len(self.waiting) >= self.config.max_queue_len:
            raise QueueFullError(
                f"{len(self.waiting)} requests waiting (max_queue_len="
                f"{self.config.max_queue_len}); try again later"
            )
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request, reason: str) -> None:
        """Take a request out of the queues for good and free its blocks."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        self.kv.free(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason

    def _preempt(self, request: Request) -> None:
        self.kv.free(request.request_id)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _choose_k(self, req: Request, batch_size: int, budget: int) -> int:
        if self.k_chooser is None or self.max_lookahead == 0 or req.drafts_off or req.draft_reading:
            return 0
        k = req.params.num_speculative_tokens  # a request's own fixed k (``specserve tune``)
        if k is None:
            limit = self.disable_by_batch_size
            if limit is not None and batch_size >= limit:
                return 0
            k = self.k_chooser.choose_k(req.request_id, batch_size)
        # The step commits at most k + 1 tokens: never draft past the output cap.
        return max(0, min(k, self.max_lookahead, req.num_output_tokens_left - 1, budget - 1))

    def schedule(self) -> SchedulerOutput:
        """Plan the next step (mutates queues and block tables, not request tokens)."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        batch_size = len(self.running) + min(
            len(self.waiting), self.config.max_num_seqs - len(self.running)
        )
        idx = 0
        while idx < len(self.running) and budget > 0:
            req = self.running[idx]
            if req.is_decoding:
                num_new, k = 1, self._choose_k(req, batch_size, budget)
            else:
                num_new, k = min(req.num_tokens - req.num_computed_tokens, budget), 0
            while not self.kv.allocate_slots(
                req.request_id, req.num_computed_tokens, req.num_computed_tokens + num_new + k
            ):
                if k > 0:
                    k = 0
                    continue
                victim = self.running.pop()  # newest first
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break  # preempted itself: it was the newest, nothing is left to schedule
            out.scheduled.append(ScheduledRequest(req, num_new, k))
            budget -= num_new + k
            idx += 1

        while (
            self.waiting
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
            and not out.preempted
        ):
            req = self.waiting[0]
            assert req.num_computed_tokens == 0
            cached_blocks, num_cached = (
                ([], 0) if req.wants_prompt_logits else self.kv.find_cached_prefix(req.token_ids)
            )
            num_new = min(req.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(
                req.request_id, num_cached, num_cached + num_new, cached_blocks
            ):
                break
            self.waiting.popleft()
            req.num_computed_tokens = num_cached
            req.status = RequestStatus.RUNNING
            bisect.insort(self.running, req, key=_arrival)
            out.scheduled.append(ScheduledRequest(req, num_new, 0))
            budget -= num_new

        out.num_batched_tokens = self.config.max_num_batched_tokens - budget
        return out
