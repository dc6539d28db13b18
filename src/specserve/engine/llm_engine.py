"""The synchronous engine: one :meth:`LLMEngine.step` = schedule, draft, verify, commit.

A step, in order (docs/design.md, "Engine contracts"):

1. ``schedule``: continuous batching picks prefill chunks, decode tokens and each decoding
   request's k (``scheduler.py``).
2. ``propose``: the proposer drafts up to k tokens for each decoding request with k > 0.
3. ``verify``: one target forward over every row (``model_runner.py``); logits only where a
   token is sampled; EOS/stop ids masked while ``min_tokens`` is not reached.
4. ``sample``: a step without drafts samples plainly (``sampling/sampler.py``, the k = 0 fast
   path); a step with drafts verifies every sampling request with the rejection sampler (a
   request without a draft then just samples its one row, consuming randomness the same way).
5. ``commit``: accepted tokens join the request; stop checks (EOS/stop ids, length, stop
   strings via the incremental detokenizer); rejected lookahead is rolled back by moving the
   computed-token pointer (``kv_manager.commit``); finished requests free their blocks.
6. ``costs``: a pure decode step's propose and verify times teach the k controller
   (``drafting.record_cost``).
7. ``draft reading``: a draft model runs the prompts that completed in this step, so their
   first propose call catches up one token, and a chunk more of the requests whose long
   prompts it reads a chunk a step (``drafting.read_prompts``); a request whose output cap
   cannot repay the pass decodes plainly (``spec_decode/prefill_budget.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from specserve.config import CacheConfig, SchedulerConfig, SpecConfig
from specserve.engine import drafting
from specserve.engine.admission import check_request
from specserve.engine.detokenizer import IncrementalDetokenizer
from specserve.engine.model_runner import ForwardRow, ModelRunner
from specserve.engine.outputs import EngineStats, RequestOutput, StepStats
from specserve.engine.request import Request
from specserve.engine.scheduler import ScheduledRequest, Scheduler
from specserve.engine.stats_tracker import StatsTracker
from specserve.engine.token_sampling import (
    num_prompt_logit_rows,
    raw_logprob_rows,
    sample_new_tokens,
    take_prompt_logprobs,
)
from specserve.kv_cache.kv_manager import KVCacheManager
from specserve.kv_cache.sizing import num_blocks_for
from specserve.loading.tokenizer import Tokenizer
from specserve.models.decoder import DecoderLM
from specserve.sampling.logprobs import TokenLogprob, gather_logprobs
from specserve.sampling.sampler import make_generator
from specserve.sampling.stop import check_new_tokens
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.prefill_budget import PrefillBudget
from specserve.spec_decode.proposer import (
    HiddenStateProposer,
    Proposal,
    Proposer,
)

logger = logging.getLogger(__name__)


class LLMEngine:
    """Continuous-batching engine over one target model (and an optional proposer).

    Attributes:
        model: the target decoder.
        tokenizer: used for stop strings and ``text_delta`` (None: token ids only).
        eos_token_ids: ids that end generation unless ``ignore_eos``.
        max_model_len: context limit (prompt + output), capped by what the KV cache can hold.
        spec: speculative decoding settings; ``proposer``/``k_controller`` implement them.
    """

    def __init__(
        self,
        model: DecoderLM,
        *,
        tokenizer: Tokenizer | None = None,
        eos_token_ids: Sequence[int] | None = None,
        cache: CacheConfig | None = None,
        scheduler: SchedulerConfig | None = None,
        spec: SpecConfig | None = None,
        proposer: Proposer | None = None,
        k_controller: KController | None = None,
        model_name: str = "model",
        max_model_len: int | None = None,
    ) -> None:
        cache = cache or CacheConfig()
        self.spec = spec or SpecConfig()
        if self.spec.enabled and (proposer is None or k_controller is None):
            raise ValueError(f"speculative method {self.spec.method!r} needs a proposer and k")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(
            eos_token_ids if eos_token_ids is not None else model.cfg.eos_token_ids
        )
        self.model_name = model_name
        # How the models run (EngineStats.model_info); set by the builder.
        self.model_info: dict[str, str] = {}
        self.proposer = proposer if self.spec.enabled else None
        # A proposer drafting from the target's hidden states (EAGLE, Medusa): every target
        # forward records them, and _commit buffers the committed rows on their requests.
        self.hidden_proposer = isinstance(self.proposer, HiddenStateProposer)
        if isinstance(self.proposer, HiddenStateProposer):
            model.capture_layers = tuple(self.proposer.target_hidden_layers)
        self.recording_hidden = False
        self.k_controller = k_controller if self.spec.enabled else None
        # Whether a draft model's prompt pass can pay for itself (drafting.read_prompts).
        self.prefill_budget = PrefillBudget()
        k_max = self.spec.num_speculative_tokens or self.spec.k_max if self.spec.enabled else 0
        num_blocks = num_blocks_for(cache, model.cfg, model.dtype)
        self.kv = KVCacheManager(num_blocks, cache.block_size, cache.enable_prefix_caching)
        self.runner = ModelRunner(model, model.make_kv_cache(num_blocks, cache.block_size))
        self.scheduler = Scheduler(
            scheduler or SchedulerConfig(),
            self.kv,
            self.k_controller,
            max_lookahead=k_max,
            disable_by_batch_size=self.spec.disable_by_batch_size,
        )
        limit = min(model.cfg.max_position_embeddings, max_model_len or 1 << 62)
        self.max_model_len = min(limit, self.kv.max_tokens_capacity - k_max)
        if self.max_model_len < 2:
            raise ValueError(f"KV cache of {num_blocks} blocks is too small for any request")
        self.requests: dict[str, Request] = {}
        self.tracker = StatsTracker(model_name, k_max)
        self._step_listeners: list[Callable[[StepStats], None]] = []

    # --- requests ----------------------------------------------------------------------------

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int:
        """Check a request before admission; returns its output cap (``admission.py``).

        Raises:
            ValueError: empty prompt, ids outside the vocabulary, prompt too long for the
                context, stop strings without a tokenizer, or k above the server's k_max.
        """
        return check_request(
            prompt_token_ids, params, self.model.cfg.vocab_size, self.max_model_len,
            has_tokenizer=self.tokenizer is not None, k_max=self.scheduler.max_lookahead,
        )  # fmt: skip

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> Request:
        """Queue a request. Raises ValueError (bad request) or QueueFullError (at the bound)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        try:
            cap = self.validate(prompt_token_ids, params)
        except ValueError:
            self.tracker.record_rejected("bad_request")
            raise
        req = Request(
            request_id,
            list(prompt_token_ids),
            params,
            max_output_tokens=cap,
            generator=make_generator(params, self.model.device),
            arrival_time=arrival_time if arrival_time is not None else time.perf_counter(),
        )
        if self.tokenizer is not None:
            req.detokenizer = IncrementalDetokenizer(
                self.tokenizer, req.prompt_token_ids, params.stop, params.min_tokens
            )
        try:
            self.scheduler.add(req)
        except Exception:
            self.tracker.record_rejected("queue_full")
            raise
        self.requests[request_id] = req
        return req

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks; its final output, or None if unknown/done."""
        req = self.requests.get(request_id)
        if req is None or req.is_finished:
            return None
        self._finish(req, "abort")
        return req.output([], "", with_spec=self.spec.enabled)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def record_hidden(self, layers: Sequence[int]) -> None:
        """Record the target's hidden states ``layers`` (Hugging Face ``hidden_states``
        numbering) of every committed position and hand each finished request's on its last
        output (``RequestOutput.hidden_states``): what training a draft head on the target's
        own generations needs, taken from the forwards that generate them (no second pass).

        Raises:
            ValueError: a proposer already captures other hidden states.
        """
        layers = tuple(layers)
        if self.hidden_proposer and layers != self.model.capture_layers:
            raise ValueError(
                f"the proposer captures hidden states {self.model.capture_layers}, not {layers}"
            )
        if not layers:
            raise ValueError("record_hidden needs at least one hidden state")
        self.model.capture_layers = layers
        self.recording_hidden = True

    def add_step_listener(self, listener: Callable[[StepStats], None]) -> None:
        """Call ``listener`` with each step's :class:`StepStats` (from the stepping thread)."""
        self._step_listeners.append(listener)

    def stats(self) -> EngineStats:
        self.tracker.update_gauges(
            len(self.scheduler.running), len(self.scheduler.waiting), self.kv.pool
        )
        snapshot = self.tracker.snapshot()
        snapshot.model_info = dict(self.model_info)
        snapshot.draft_prompt_token_s = self.prefill_budget.seconds_per_token
        return snapshot

    # --- the step ----------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one engine step; outputs of every request that committed tokens or finished."""
        sched = self.scheduler.schedule()
        stats = StepStats(num_preemptions=len(sched.preempted))
        for req in sched.preempted:
            req.draft_reading = False  # its lane goes: read afresh once recomputed
            if self.proposer is not None:
                self.proposer.release(req.request_id)
        outputs: list[RequestOutput] = []
        if sched.scheduled:
            proposals = drafting.propose(
                self.proposer, sched.scheduled, stats, self.hidden_proposer
            )
            # requests whose prompt (or recomputation after preemption) completes in this step
            prompted = [
                sr.request for sr in sched.scheduled if sr.samples and not sr.request.is_decoding
            ]
            t0 = time.perf_counter()
            sampled = self._verify(sched.scheduled, proposals)
            stats.verify_s = time.perf_counter() - t0
            outputs = self._commit(sched.scheduled, proposals, sampled, stats)
            drafting.record_cost(
                self.k_controller, self.proposer, sched.scheduled, proposals, stats,
                self.runner.last_num_tokens,
            )  # fmt: skip
            live = [req for req in prompted if req.request_id in self.requests]
            reading = [req for req in self.scheduler.running if req.draft_reading]
            drafting.read_prompts(
                self.proposer, live, reading, stats, self.k_controller, self.prefill_budget,
                batch_size=max(1, len(self.scheduler.running)),
            )  # fmt: skip
        stats.num_running = len(self.scheduler.running)
        stats.num_waiting = len(self.scheduler.waiting)
        stats.kv_cache_usage = self.kv.pool.usage
        self.tracker.record_step(stats)
        for listener in self._step_listeners:
            listener(stats)
        return outputs

    def _verify(
        self, scheduled: list[ScheduledRequest], proposals: list[Proposal]
    ) -> dict[int, tuple[list[int], list[TokenLogprob] | None]]:
        """One target forward; returns, per sampling row index, its new tokens (accepted
        drafts + one sampled) and, if the request asked for them, their logprobs. Prompt
        logprobs are recorded on their requests as their chunks run."""
        rows, num_prompt, num_sample = [], [], []
        for sr, prop in zip(scheduled, proposals, strict=True):
            req, start = sr.request, sr.request.num_computed_tokens
            num_prompt.append(num_prompt_logit_rows(req, sr.num_new_tokens))
            num_sample.append(len(prop) + 1 if sr.samples else 0)
            rows.append(
                ForwardRow(
                    token_ids=req.token_ids[start : start + sr.num_new_tokens]
                    + prop.draft_token_ids,
                    start=start,
                    block_table=self.kv.block_tables[req.request_id],
                    num_logit_rows=num_prompt[-1] + num_sample[-1],
                    prompt_logits=num_prompt[-1] > 0,
                )
            )
        sampling = [i for i, sr in enumerate(scheduled) if sr.samples]
        logits = self.runner.execute(rows)  # [sum_i num_prompt[i] + num_sample[i], vocab]
        if any(num_prompt):  # prompt-logprob rows recorded, then dropped
            requests = [sr.request for sr in scheduled]
            logits = take_prompt_logprobs(logits, requests, num_prompt, num_sample)
        if not sampling:
            return {}
        reqs, props = [scheduled[i].request for i in sampling], [proposals[i] for i in sampling]
        wanted = raw_logprob_rows(logits, reqs, props)  # empty unless someone asked
        accepted = sample_new_tokens(logits, reqs, props, self.eos_token_ids)
        out: dict[int, tuple[list[int], list[TokenLogprob] | None]] = {}
        for j, (i, new) in enumerate(zip(sampling, accepted, strict=True)):
            n = reqs[j].params.logprobs
            out[i] = (new, gather_logprobs(wanted[j], new, n) if n is not None else None)
        return out

    def _commit(
        self,
        scheduled: list[ScheduledRequest],
        proposals: list[Proposal],
        sampled: dict[int, tuple[list[int], list[TokenLogprob] | None]],
        stats: StepStats,
    ) -> list[RequestOutput]:
        outputs = []
        keep = self.hidden_proposer or self.recording_hidden
        hidden = self.runner.last_hidden if keep else []
        for i, sr in enumerate(scheduled):
            req = sr.request
            stats.num_scheduled_tokens += sr.num_new_tokens
            if hidden:  # the rows of the positions whose K/V this step makes final
                num_final = sr.num_new_tokens + (len(sampled[i][0]) - 1 if i in sampled else 0)
                req.keep_hidden(req.num_computed_tokens, hidden[i][:num_final])
            if i not in sampled:  # a prefill chunk short of the end: nothing to sample
                req.num_computed_tokens += sr.num_new_tokens
                self.kv.commit(req.request_id, req.token_ids, req.num_computed_tokens)
                continue
            new, logprobs = sampled[i]
            num_drafted, num_accepted = len(proposals[i]), len(new) - 1
            stats.num_draft_tokens += num_drafted
            if num_drafted:
                req.spec_stats.observe(num_drafted, num_accepted)
                stats.spec.observe(num_drafted, num_accepted)
                assert self.k_controller is not None
                self.k_controller.observe(
                    req.request_id, num_drafted, num_accepted, num_asked=sr.num_lookahead
                )
            elif self.spec.enabled and req.is_decoding:
                stats.num_spec_off += 1
            if req.num_output_tokens == 0:
                stats.num_prompt_tokens += req.num_prompt_tokens
            decision = check_new_tokens(
                new, req.num_output_tokens, req.params, self.eos_token_ids, req.max_output_tokens
            )
            kept, reason = new[: decision.num_kept], decision.finish_reason
            if req.detokenizer is not None:
                consumed = req.detokenizer.add_tokens(kept)
                if req.detokenizer.stopped:
                    kept, reason = kept[:consumed], "stop"
            # K/V is final for the tokens run this step up to the last accepted draft.
            num_computed = req.num_computed_tokens + sr.num_new_tokens + num_accepted
            req.token_ids.extend(kept)
            stats.num_generation_tokens += len(kept)
            if req.first_token_time is None:
                req.first_token_time = time.perf_counter()
            if reason is None:
                req.num_computed_tokens = num_computed
                assert req.num_computed_tokens == req.num_tokens - 1
                self.kv.commit(req.request_id, req.token_ids, num_computed)
            else:
                self._finish(req, reason)
            delta = req.detokenizer.take_delta(reason is not None) if req.detokenizer else ""
            out = req.output(kept, delta, with_spec=self.spec.enabled)
            if reason is not None and self.recording_hidden:
                out.hidden_states = req.recorded_hidden()
            if logprobs is not None:
                out.logprobs = logprobs[: len(kept)]
            if req.prompt_logprobs is not None and req.num_output_tokens == len(kept):
                out.prompt_logprobs = req.prompt_logprobs
            outputs.append(out)
        return outputs

    def _finish(self, req: Request, reason: str) -> None:
        self.scheduler.finish(req, reason)
        if self.proposer is not None:
            self.proposer.release(req.request_id)
        if self.k_controller is not None:
            self.k_controller.release(req.request_id)
        self.tracker.record_finished(reason)
        del self.requests[req.request_id]
