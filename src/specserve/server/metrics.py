"""Prometheus metrics of one server app (its own ``CollectorRegistry``, never the global one).

Two sources feed the exposition:

* **request timings measured here** (``RequestMetrics``): time to first token, time per output
  token, end-to-end latency, prompt/generation token counters, finished and rejected requests;
* **engine counters read at scrape time** (``EngineStatsCollector``): running/waiting requests,
  KV usage, speculative-decoding counters (also per draft position), k chosen, draft and verify
  step time, speculation-off steps and preemptions, from ``engine.stats()``.

Names follow vLLM where a vLLM metric with the same meaning exists (so one scraper reads both);
counters get the ``_total`` suffix in the text exposition. Every metric has the ``model_name``
label. Definitions:

* ``vllm:time_to_first_token_seconds``: request arrival → first generated token ready.
* ``vllm:time_per_output_token_seconds``: per request, (e2e − ttft) / (n − 1) for n ≥ 2 tokens.
* ``vllm:e2e_request_latency_seconds``: request arrival → last token ready.
* ``specserve:spec_k_chosen``: k (draft tokens asked for) per request per engine step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from specserve.engine.outputs import EngineStats, StepStats

LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
)  # fmt: skip
STEP_BUCKETS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)  # fmt: skip
K_BUCKET_MAX = 32  # SpecConfig allows k in [0, 32]
FINISHED_REASONS = ("stop", "length", "abort")
REJECT_REASONS = ("queue_full", "bad_request")


class EngineStatsCollector(Collector):
    """Reads ``engine.stats()`` once per scrape and yields the engine-side metric families
    (counters keep the engine's cumulative values; k chosen is exact from its counts)."""

    def __init__(self, stats: Callable[[], EngineStats | None], model_name: str) -> None:
        self._stats = stats
        self._model_name = model_name

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic: avoids a stats() call at registration time

    def collect(self) -> Iterator[Metric]:
        st = self._stats()
        if st is None:  # model still loading: no engine metrics yet
            return
        labels = [self._model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric(labels, value)
            return fam

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            fam = CounterMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric(labels, value)
            return fam

        yield gauge("vllm:num_requests_running", "Requests in the running batch.",
                    st.num_running)  # fmt: skip
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                    st.num_waiting)  # fmt: skip
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).",
                    st.kv_cache_usage)  # fmt: skip
        yield counter("vllm:spec_decode_num_drafts", "Speculative steps with a draft.",
                      st.spec.num_drafts)  # fmt: skip
        yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.",
                      st.spec.num_draft_tokens)  # fmt: skip
        yield counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                      st.spec.num_accepted_tokens)  # fmt: skip
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0-based).",
            labels=["model_name", "position"],
        )
        for pos, n in enumerate(st.spec.num_accepted_tokens_per_pos):
            per_pos.add_metric([self._model_name, str(pos)], n)
        yield per_pos
        yield counter("specserve:spec_off_steps", "Request steps decoded with k = 0.",
                      st.num_spec_off_steps)  # fmt: skip
        yield counter("specserve:prompts_undrafted",
                      "Requests decoded without drafts: the output cap could not repay the "
                      "draft model's pass over the prompt.", st.num_prompts_undrafted)  # fmt: skip
        yield counter("specserve:prompts_read_in_chunks",
                      "Requests whose prompt the draft model read a chunk a step while they "
                      "decoded plainly.", st.num_prompts_chunked)  # fmt: skip
        if st.draft_prompt_token_s is not None:
            yield gauge("specserve:draft_prompt_token_seconds",
                        "The draft model's measured seconds per prompt token.",
                        st.draft_prompt_token_s)  # fmt: skip
        yield counter("specserve:num_preemptions", "Requests preempted for KV space.",
                      st.num_preemptions)  # fmt: skip
        k_hist = HistogramMetricFamily(
            "specserve:spec_k_chosen", "k chosen per request per step.", labels=["model_name"]
        )
        k_hist.add_metric(labels, *k_chosen_buckets(st.k_chosen_counts))
        yield k_hist
        if st.model_info:
            yield InfoMetricFamily(
                "specserve:model",
                "How the models run: weight format, compute dtype, decode/verify path.",
                value={"model_name": self._model_name, **st.model_info},
            )


def k_chosen_buckets(counts: dict[int, int]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets ``le = 0, 1, ..., K_BUCKET_MAX, +Inf`` and the sum of k."""
    buckets: list[tuple[str, float]] = []
    running = 0
    for k in range(K_BUCKET_MAX + 1):
        running += counts.get(k, 0)
        buckets.append((str(float(k)), float(running)))
    buckets.append(("+Inf", float(sum(counts.values()))))
    return buckets, float(sum(k * n for k, n in counts.items()))


class StepMetrics:
    """Per-step histograms fed by the engine's step listener (draft and verify time)."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        lbl = ["model_name"]
        self.draft_time = Histogram("specserve:draft_time_seconds",
                                    "Proposer wall time per step that drafted.", lbl,
                                    registry=registry, buckets=STEP_BUCKETS_S)  # fmt: skip
        self.verify_time = Histogram("specserve:verify_time_seconds",
                                     "Target forward + verification wall time per step.", lbl,
                                     registry=registry, buckets=STEP_BUCKETS_S)  # fmt: skip
        self.draft_time.labels(model_name)
        self.verify_time.labels(model_name)

    def observe_step(self, step: StepStats) -> None:
        if step.draft_s > 0:
            self.draft_time.labels(self.model_name).observe(step.draft_s)
        if step.verify_s > 0:
            self.verify_time.labels(self.model_name).observe(step.verify_s)


class RequestMetrics:
    """Per-request metrics measured in the server, in the app's registry."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        lbl = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                              lbl, registry=registry, buckets=LATENCY_BUCKETS_S)  # fmt: skip
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Per request (e2e - ttft) / (n - 1).", lbl, registry=registry,
                              buckets=LATENCY_BUCKETS_S)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                             lbl, registry=registry, buckets=LATENCY_BUCKETS_S)  # fmt: skip
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", lbl,
                                     registry=registry)  # fmt: skip
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", lbl,
                                         registry=registry)  # fmt: skip
        self.request_success = Counter("vllm:request_success", "Finished requests.",
                                       [*lbl, "finished_reason"], registry=registry)  # fmt: skip
        self.rejected = Counter("specserve:requests_rejected", "Requests refused.",
                                [*lbl, "reason"], registry=registry)  # fmt: skip
        # Expose zero-valued series up front so dashboards and scrapers see every label.
        for reason in FINISHED_REASONS:
            self.request_success.labels(model_name, reason)
        for reason in REJECT_REASONS:
            self.rejected.labels(model_name, reason)
        self.ttft.labels(model_name)
        self.tpot.labels(model_name)
        self.e2e.labels(model_name)
        self.prompt_tokens.labels(model_name)
        self.generation_tokens.labels(model_name)

    def count_rejected(self, reason: str) -> None:
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        self.rejected.labels(self.model_name, reason).inc()

    def observe_finished(
        self,
        *,
        num_prompt_tokens: int,
        num_generated_tokens: int,
        finish_reason: str,
        ttft_s: float | None,
        e2e_s: float,
    ) -> None:
        """Record one finished (or aborted) request."""
        m = self.model_name
        self.prompt_tokens.labels(m).inc(num_prompt_tokens)
        self.generation_tokens.labels(m).inc(num_generated_tokens)
        self.request_success.labels(m, finish_reason).inc()
        if ttft_s is not None:
            self.ttft.labels(m).observe(ttft_s)
            if num_generated_tokens >= 2:
                self.tpot.labels(m).observe((e2e_s - ttft_s) / (num_generated_tokens - 1))
        self.e2e.labels(m).observe(e2e_s)


class ServerMetrics:
    """The registry of one app with both metric sources."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = RequestMetrics(self.registry, model_name)
        self.steps = StepMetrics(self.registry, model_name)
        self.registry.register(EngineStatsCollector(stats, model_name))

    def count_rejected(self, reason: str) -> None:
        self.requests.count_rejected(reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)
