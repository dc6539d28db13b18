"""The Prometheus exposition: names, labels, _total suffixes, values from engine stats."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from specserve.engine.outputs import EngineStats, StepStats
from specserve.server.metrics import ServerMetrics, k_chosen_buckets
from specserve.spec_decode.stats import SpecDecodingStats


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_no_engine_metrics_while_loading_but_request_metrics_exist() -> None:
    m = ServerMetrics("tiny", lambda: None)
    got = samples(m)
    names = {name for name, _ in got}
    assert "vllm:num_requests_running" not in names
    assert "vllm:request_success_total" in names
    assert (
        "specserve:requests_rejected_total",
        (("model_name", "tiny"), ("reason", "queue_full")),
    ) in got


def test_engine_stats_become_metrics() -> None:
    spec = SpecDecodingStats()
    spec.observe(3, 2)
    spec.observe(2, 0)
    stats = EngineStats(
        num_running=2,
        num_waiting=5,
        kv_cache_usage=0.25,
        spec=spec,
        k_chosen_counts={0: 4, 3: 1, 2: 1},
        num_spec_off_steps=4,
        num_preemptions=1,
        num_prompts_undrafted=3,
        num_prompts_chunked=2,
        draft_prompt_token_s=0.003,
    )
    m = ServerMetrics("tiny", lambda: stats)
    m.steps.observe_step(StepStats(draft_s=0.01, verify_s=0.2))
    m.steps.observe_step(StepStats(draft_s=0.0, verify_s=0.1))
    got = samples(m)
    lbl = (("model_name", "tiny"),)
    assert got[("vllm:num_requests_running", lbl)] == 2
    assert got[("vllm:num_requests_waiting", lbl)] == 5
    assert got[("vllm:kv_cache_usage_perc", lbl)] == 0.25
    assert got[("vllm:spec_decode_num_drafts_total", lbl)] == 2
    assert got[("vllm:spec_decode_num_draft_tokens_total", lbl)] == 5
    assert got[("vllm:spec_decode_num_accepted_tokens_total", lbl)] == 2
    pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert got[(pos, (("model_name", "tiny"), ("position", "0")))] == 1
    assert got[(pos, (("model_name", "tiny"), ("position", "1")))] == 1
    assert got[(pos, (("model_name", "tiny"), ("position", "2")))] == 0
    assert got[("specserve:spec_off_steps_total", lbl)] == 4
    assert got[("specserve:num_preemptions_total", lbl)] == 1
    assert got[("specserve:prompts_undrafted_total", lbl)] == 3
    assert got[("specserve:prompts_read_in_chunks_total", lbl)] == 2
    assert got[("specserve:draft_prompt_token_seconds", lbl)] == 0.003
    unmeasured = samples(ServerMetrics("tiny", lambda: EngineStats()))
    assert not [name for name, _ in unmeasured if name == "specserve:draft_prompt_token_seconds"]
    assert got[("specserve:spec_k_chosen_count", lbl)] == 6
    assert got[("specserve:spec_k_chosen_sum", lbl)] == 5
    assert got[("specserve:spec_k_chosen_bucket", (("le", "0.0"), ("model_name", "tiny")))] == 4
    assert got[("specserve:draft_time_seconds_count", lbl)] == 1
    assert got[("specserve:verify_time_seconds_count", lbl)] == 2


def test_request_observations() -> None:
    m = ServerMetrics("tiny", lambda: None)
    m.requests.observe_finished(
        num_prompt_tokens=7, num_generated_tokens=5, finish_reason="length", ttft_s=0.5, e2e_s=1.5
    )
    m.requests.observe_finished(
        num_prompt_tokens=3, num_generated_tokens=0, finish_reason="abort", ttft_s=None, e2e_s=0.1
    )
    m.count_rejected("bad_request")
    got = samples(m)
    lbl = (("model_name", "tiny"),)
    assert got[("vllm:prompt_tokens_total", lbl)] == 10
    assert got[("vllm:generation_tokens_total", lbl)] == 5
    assert got[("vllm:request_success_total", (("finished_reason", "length"), *lbl))] == 1
    assert got[("vllm:request_success_total", (("finished_reason", "abort"), *lbl))] == 1
    assert got[("vllm:time_to_first_token_seconds_count", lbl)] == 1
    assert got[("vllm:time_per_output_token_seconds_sum", lbl)] == 0.25  # (1.5 - 0.5) / 4
    assert got[("vllm:e2e_request_latency_seconds_count", lbl)] == 2
    rejected = (
        "specserve:requests_rejected_total",
        (("model_name", "tiny"), ("reason", "bad_request")),
    )
    assert got[rejected] == 1


def test_two_apps_do_not_share_a_registry() -> None:
    a = ServerMetrics("a", lambda: None)
    b = ServerMetrics("b", lambda: None)
    a.count_rejected("queue_full")
    key = ("specserve:requests_rejected_total", (("model_name", "b"), ("reason", "queue_full")))
    assert samples(b)[key] == 0


def test_k_buckets_are_cumulative() -> None:
    buckets, total = k_chosen_buckets({1: 2, 4: 3})
    as_dict = dict(buckets)
    assert as_dict["0.0"] == 0 and as_dict["1.0"] == 2 and as_dict["3.0"] == 2
    assert as_dict["4.0"] == 5 and as_dict["+Inf"] == 5 and total == 14


def test_model_info_is_an_info_metric() -> None:
    info = {"target_weights": "bf16", "target_dtype": "bfloat16",
            "target_decode_path": "native bf16_decoder_layer"}  # fmt: skip
    got = samples(ServerMetrics("tiny", lambda: EngineStats(model_info=info)))
    assert got[("specserve:model_info", tuple(sorted({"model_name": "tiny", **info}.items())))] == 1
    plain = samples(ServerMetrics("tiny", lambda: EngineStats()))
    assert not any(name == "specserve:model_info" for name, _ in plain)
