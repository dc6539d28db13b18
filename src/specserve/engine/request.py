"""Per-request engine state: tokens, KV progress, status, sampling generator, spec counters.

Terms:
    committed tokens: ``token_ids`` = prompt + accepted output; drafts never enter it.
    computed tokens: the leading committed tokens whose K/V sits in the cache
        (``num_computed_tokens``). A decoding request has exactly one committed token not yet
        computed (the last sampled one); a request still in prefill has more.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from specserve.engine.detokenizer import IncrementalDetokenizer
from specserve.engine.outputs import RequestOutput, SpecRequestSummary
from specserve.sampling.logprobs import TokenLogprob
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.stats import SpecDecodingStats


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not yet admitted, or preempted and waiting to be recomputed
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One generation request as the engine tracks it.

    Attributes:
        request_id: caller-chosen unique id.
        prompt_token_ids: the prompt.
        params: sampling parameters.
        max_output_tokens: generation cap: ``params.max_tokens`` limited by the context room.
        generator: seeded per-request generator, or None for the global RNG.
        arrival_time: ``time.perf_counter()`` when the request was added.
        token_ids: committed tokens (prompt + output), grown in place.
        num_computed_tokens: committed tokens whose K/V is in the cache.
        status: waiting, running or finished.
        finish_reason: ``stop``, ``length`` or ``abort`` once finished.
        spec_stats: acceptance counters of this request.
        num_preemptions: times the request lost its blocks and had to be recomputed.
        detokenizer: incremental text state (None when the engine has no tokenizer).
        first_token_time: ``perf_counter()`` when its first output token was committed.
        prompt_logprobs: when ``params.prompt_logprobs`` is set, the logprobs of the prompt
            tokens gathered so far (the first prompt token's entry is None).
        hidden_start / hidden_parts: for a proposer that drafts from the target's hidden
            states (EAGLE, Medusa): the target's captured hidden states of committed
            positions ``hidden_start ..`` not yet handed to the proposer, in order.
        drafts_off: the request decodes without drafts (its draft model's prompt pass could
            not pay for itself: ``spec_decode/prefill_budget.py``).
        draft_reading: the draft model is reading the request's tokens a chunk a step; it
            decodes without drafts until the lane has caught up.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_output_tokens: int
    generator: torch.Generator | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    spec_stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    num_preemptions: int = 0
    detokenizer: IncrementalDetokenizer | None = None
    first_token_time: float | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    hidden_start: int = 0
    hidden_parts: list[torch.Tensor] = field(default_factory=list)
    drafts_off: bool = False
    draft_reading: bool = False

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: prompt must not be empty")
        if self.max_output_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: no room for output tokens")
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]

    def keep_hidden(self, start: int, hidden: torch.Tensor) -> None:
        """Buffer the target's hidden states of committed positions ``start ..``; a gap (after
        a preemption or a prefix-cache hit) starts the buffer afresh at ``start``."""
        if start != self.hidden_start + sum(len(h) for h in self.hidden_parts):
            self.hidden_parts, self.hidden_start = [], start
        if len(hidden):
            self.hidden_parts.append(hidden)

    def take_hidden(self) -> tuple[int, torch.Tensor | None]:
        """The buffered hidden states and the position of their first row; empties the
        buffer (the next ones start where these end)."""
        start, parts = self.hidden_start, self.hidden_parts
        if not parts:
            return start, None
        self.hidden_parts = []
        self.hidden_start = start + sum(len(h) for h in parts)
        return start, parts[0] if len(parts) == 1 else torch.cat(parts)

    def output(
        self, new_token_ids: list[int], text_delta: str, *, with_spec: bool
    ) -> RequestOutput:
        """This request's stream chunk for a step (``with_spec``: carry its acceptance)."""
        return RequestOutput(
            request_id=self.request_id,
            new_token_ids=new_token_ids,
            text_delta=text_delta,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generated_tokens=self.num_output_tokens,
            finished=self.is_finished,
            finish_reason=self.finish_reason,
            spec=SpecRequestSummary.from_stats(self.spec_stats) if with_spec else None,
            arrival_time=self.arrival_time,
            first_token_time=self.first_token_time,
            num_preemptions=self.num_preemptions,
        )

    def recorded_hidden(self) -> torch.Tensor | None:
        """A finished request's recorded hidden states of positions ``0 .. num_tokens - 2``
        (None if the record does not start at 0: a prefix-cache hit skipped its forward)."""
        start, hidden = self.take_hidden()
        if start != 0 or hidden is None:
            return None
        return hidden[: self.num_tokens - 1]

    @property
    def wants_prompt_logits(self) -> bool:
        """Prompt logprobs were asked for and not all gathered yet: every prompt position
        must be computed (no prefix-cache reuse) and return its logits."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(
            self.prompt_token_ids
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is left to run: the next step is a decode (+ drafts)."""
        return self.num_tokens - self.num_computed_tokens == 1 and self.num_output_tokens > 0

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def num_output_tokens_left(self) -> int:
        return self.max_output_tokens - self.num_output_tokens
