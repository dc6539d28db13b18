"""What the engine hands to its callers: per-step request outputs and engine statistics.

These are the contract with the server (``server/``): fields are only ever added.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

from specserve.sampling.logprobs import TokenLogprob
from specserve.spec_decode.stats import SpecDecodingStats


@dataclass
class SpecRequestSummary:
    """Speculation counters of one request (definitions in ``spec_decode/stats.py``)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    mean_acceptance_length: float

    @classmethod
    def from_stats(cls, stats: SpecDecodingStats) -> SpecRequestSummary:
        return cls(
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens,
            stats.mean_acceptance_length,
        )


@dataclass
class RequestOutput:
    """One stream chunk of one request.

    Attributes:
        request_id: the request.
        new_token_ids: tokens committed this step (several under speculation).
        text_delta: newly final text (stop strings removed, possible stop-string starts held
            back until decided); empty when the engine has no tokenizer.
        num_prompt_tokens: prompt length.
        num_generated_tokens: output tokens so far (a final EOS/stop id counts, like vLLM).
        finished: this is the request's last output.
        finish_reason: ``stop``, ``length`` or ``abort`` when finished, else None.
        spec: the request's speculation counters (None when speculation is off).
        arrival_time: ``time.perf_counter()`` at admission (for server-side latencies).
        first_token_time: ``time.perf_counter()`` of the first committed token, if any.
        num_preemptions: times the request was preempted and recomputed so far.
        logprobs: one entry per ``new_token_ids`` when the request asked for logprobs, else
            None (``sampling/logprobs.py`` says which distribution).
        prompt_logprobs: on the request's first output with tokens, when it asked for prompt
            logprobs: one entry per prompt token, None for the first (nothing scores it).
        hidden_states: on a finished request's last output, when the engine records hidden
            states (:meth:`LLMEngine.record_hidden`): ``# [n, features]`` the target's
            captured hidden states of positions ``0 .. n - 1`` (every committed token but the
            last, which no forward ran), as the forwards computed them.
    """

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    num_prompt_tokens: int
    num_generated_tokens: int
    finished: bool
    finish_reason: str | None
    spec: SpecRequestSummary | None = None
    arrival_time: float | None = None
    first_token_time: float | None = None
    num_preemptions: int = 0
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    hidden_states: torch.Tensor | None = None


@dataclass
class StepStats:
    """What one engine step did (passed to step listeners, e.g. the Prometheus exporter).

    Attributes:
        num_running: requests running after the step.
        num_waiting: requests waiting after the step.
        kv_cache_usage: fraction of KV blocks in use, 0..1.
        num_scheduled_tokens: committed tokens run through the target (prefill + decode).
        num_draft_tokens: draft tokens verified in the step.
        k_chosen: k chosen for each decoding request this step (speculation enabled only).
        num_spec_off: decoding requests that ran without a draft (k = 0 or empty proposal)
            while speculation is enabled.
        num_preemptions: requests preempted in this step.
        draft_s: wall time of the proposer (0 when nothing was proposed).
        verify_s: wall time of the target forward and sampling/verification.
        spec: acceptance counters of this step's verifications.
        num_prompt_tokens: prompt tokens of requests that produced their first token now.
        num_generation_tokens: output tokens committed in the step.
        num_prompts_undrafted: requests whose prompt the draft model did not read in the step
            (their output cap could not repay the pass: ``spec_decode/prefill_budget.py``).
        num_prompts_chunked: requests whose prompt the draft model began to read a chunk a
            step in the step.
    """

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_scheduled_tokens: int = 0
    num_draft_tokens: int = 0
    k_chosen: list[int] = field(default_factory=list)
    num_spec_off: int = 0
    num_preemptions: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_prompts_undrafted: int = 0
    num_prompts_chunked: int = 0


TIME_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass
class HistogramCounts:
    """A cumulative histogram kept by the engine (non-cumulative bucket counts).

    Attributes:
        upper_bounds: bucket upper bounds, increasing, without +Inf.
        bucket_counts: observations per bucket; one more entry than ``upper_bounds`` (the
            last counts observations above every bound).
        total: sum of the observed values.
    """

    upper_bounds: tuple[float, ...]
    bucket_counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.bucket_counts:
            self.bucket_counts = [0] * (len(self.upper_bounds) + 1)
        assert len(self.bucket_counts) == len(self.upper_bounds) + 1

    def observe(self, value: float) -> None:
        idx = bisect.bisect_left(self.upper_bounds, value)  # first bound >= value
        self.bucket_counts[idx] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.bucket_counts)

    def copy(self) -> HistogramCounts:
        return HistogramCounts(self.upper_bounds, list(self.bucket_counts), self.total)


@dataclass
class EngineStats:
    """Cumulative engine counters plus the current gauges (a snapshot).

    Attributes:
        model_name: served model name.
        num_running / num_waiting: current requests per state.
        kv_cache_usage: fraction of KV blocks in use, 0..1.
        num_blocks_total / num_blocks_free / num_blocks_cached: block pool counts (usable
            blocks only; "cached" = findable by the prefix cache).
        prefix_cache_queries / prefix_cache_hits: blocks looked up / found (cumulative).
        spec: cumulative acceptance counters (per position included).
        k_chosen_counts: how often each k was chosen for a decoding request.
        k_chosen_hist / draft_time_hist / verify_time_hist: histograms of k per request per
            step and of the per-step proposer / verify seconds.
        num_spec_off_steps: request-steps decoded without a draft while speculation is on.
        num_prompts_undrafted: requests left without drafts because their output cap could
            not repay the draft model's pass over their prompt.
        num_prompts_chunked: requests whose prompt the draft model read a chunk a step.
        draft_prompt_token_s: the draft model's measured seconds per prompt token (None
            before a pass was timed, or without a draft model).
        draft_s / verify_s: cumulative proposer and target-verify seconds.
        num_steps: engine steps run.
        num_preemptions: requests preempted (cumulative).
        num_prompt_tokens / num_generation_tokens: cumulative token counts.
        num_finished: finished requests per finish reason.
        num_rejected: requests refused at admission per reason (``queue_full``,
            ``bad_request``).
        model_info: how the models run (``target_weights``, ``target_dtype``,
            ``target_decode_path``, and the ``draft_`` ones with a draft model), as the
            builder described them; empty for engines built otherwise.
    """

    model_name: str = ""
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_blocks_total: int = 0
    num_blocks_free: int = 0
    num_blocks_cached: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    k_chosen_counts: dict[int, int] = field(default_factory=dict)
    k_chosen_hist: HistogramCounts = field(default_factory=lambda: HistogramCounts((0.0,)))
    draft_time_hist: HistogramCounts = field(
        default_factory=lambda: HistogramCounts(TIME_BUCKETS_S)
    )
    verify_time_hist: HistogramCounts = field(
        default_factory=lambda: HistogramCounts(TIME_BUCKETS_S)
    )
    num_spec_off_steps: int = 0
    num_prompts_undrafted: int = 0
    num_prompts_chunked: int = 0
    draft_prompt_token_s: float | None = None
    draft_s: float = 0.0
    verify_s: float = 0.0
    num_steps: int = 0
    num_preemptions: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_finished: dict[str, int] = field(default_factory=dict)
    num_rejected: dict[str, int] = field(default_factory=dict)
    model_info: dict[str, str] = field(default_factory=dict)
