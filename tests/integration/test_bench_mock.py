"""The benchmark client against the mock server: every metric and edge case.

Timing checks run the mock in its own process (like a real server) with delays large
enough that a noisy 2-core machine stays inside the tolerances: a measured latency can never
be below the configured one (the server sleeps at least that long), and may exceed it by the
scheduling noise allowed here. They would fail for llmperf-style accounting (one token per
chunk, ITL including TTFT), which the multi-token case checks explicitly.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable, Iterator

import httpx
import pytest

from specserve.bench.inputs import BenchConfig, ClosedLoop, OpenLoop, SamplingConfig, WorkloadConfig
from specserve.bench.mock_server import MockConfig, serve_in_thread, token_text
from specserve.bench.records import RequestRecord
from specserve.bench.results import BenchResult
from specserve.bench.runner import run_ab, run_benchmark, run_sweep
from specserve.bench.selfcheck import start_mock
from specserve.net import free_port

NOISE_MS = 60.0  # allowed scheduling delay on a loaded 2-core machine


def spec(url: str, **kw: object) -> BenchConfig:
    base: dict = dict(
        base_url=url,
        model="mock-model",
        num_requests=6,
        workload=WorkloadConfig(suites=("structured",)),
        load=ClosedLoop(concurrency=2),
        sampling=SamplingConfig(max_tokens=64),
    )
    return BenchConfig(**(base | kw))


@pytest.fixture
def mock_process() -> Iterator[Callable[..., str]]:
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        port = free_port()
        procs.append(start_mock(list(args), port))
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def ok_records(result: BenchResult) -> list[RequestRecord]:
    recs = result.measured()
    assert all(r.ok for r in recs), [r.error for r in recs]
    return recs


def test_single_token_chunks_match_configured_delays(mock_process: Callable[..., str]) -> None:
    url = mock_process("--ttft-ms", "150", "--itl-ms", "40", "--output-tokens", "12")
    result = run_benchmark(spec(url))
    recs = ok_records(result)
    s = result.summary["*"]
    assert s.ttft_s.p50 is not None and s.itl_s.p50 is not None and s.tpot_s.p50 is not None
    assert 150 <= s.ttft_s.p50 * 1000 <= 150 + NOISE_MS
    assert 40 * 0.95 <= s.itl_s.p50 * 1000 <= 40 + NOISE_MS / 4
    assert 40 * 0.95 <= s.tpot_s.p50 * 1000 <= 40 + NOISE_MS / 4
    assert all(r.tokens_per_chunk == [1] * 12 and r.num_tokens == 12 for r in recs)
    assert not any(r.tokens_estimated or r.chunk_tokens_estimated for r in recs)
    # E2E = TTFT + 11 gaps
    assert s.e2e_s.p50 is not None and 590 <= s.e2e_s.p50 * 1000 <= 590 + 2 * NOISE_MS


def test_multi_token_chunks_per_token_itl(mock_process: Callable[..., str]) -> None:
    url = mock_process(
        "--ttft-ms", "150", "--itl-ms", "20", "--tokens-per-chunk", "4", "--output-tokens", "24"
    )
    result = run_benchmark(spec(url))
    recs = ok_records(result)
    s = result.summary["*"]
    assert all(r.tokens_per_chunk == [4] * 6 for r in recs)
    assert s.itl_s.p50 is not None and s.icl_s.p50 is not None and s.tpot_s.p50 is not None
    assert 20 * 0.95 <= s.itl_s.p50 * 1000 <= 20 + NOISE_MS / 4  # per token, not per chunk
    assert 80 * 0.95 <= s.icl_s.p50 * 1000 <= 80 + NOISE_MS
    expected_tpot = (24 - 4) / (24 - 1) * 20
    assert expected_tpot * 0.95 <= s.tpot_s.p50 * 1000 <= expected_tpot + NOISE_MS / 4
    assert s.tokens_per_chunk.p50 == 4
    # llmperf-style ITL (E2E / chunks, one token per chunk) is far off: ≈ (150 + 5·80) / 6 ms
    assert s.llmperf_itl_s.p50 is not None and s.llmperf_itl_s.p50 > 3 * s.itl_s.p50


def test_split_frames_and_empty_chunks_and_usage_only_chunk() -> None:
    cfg = MockConfig(
        ttft_ms=5,
        itl_ms=2,
        tokens_per_chunk=2,
        output_tokens=10,
        split_frames=True,
        empty_chunks=True,
    )
    with serve_in_thread(cfg) as server:
        result = run_benchmark(spec(f"http://127.0.0.1:{server.port}", endpoint="completions"))
    for r in ok_records(result):
        assert r.tokens_per_chunk == [2] * 5 and r.num_tokens == 10
        assert r.output_text == "".join(token_text(_prompt_of(r), i) for i in range(10))
        # 5 empty + 5 content chunks + the usage-only chunk, which carries no token
        assert len(r.chunks) == 11
        last = r.chunks[-1]
        assert not last.has_choice and last.usage_completion_tokens == 10
        assert r.e2e_s is not None and r.e2e_s * 1e9 < last.t_ns - r.send_ns + 1
        assert r.finish_reason == "stop"  # 10 tokens < max_tokens


def test_canned_reply_streams_and_answers_the_same_text() -> None:
    reply = "    return sorted(x)\n\n"
    with serve_in_thread(MockConfig(ttft_ms=1, itl_ms=1, reply=reply)) as server:
        result = run_benchmark(spec(f"http://127.0.0.1:{server.port}"))
        url = f"http://127.0.0.1:{server.port}/v1/completions"
        whole = httpx.post(url, json={"prompt": "p", "max_tokens": 64}).json()
        cut = httpx.post(url, json={"prompt": "p", "max_tokens": 2}).json()
    for r in ok_records(result):
        assert r.output_text == reply and r.num_tokens == 3 and r.finish_reason == "stop"
    assert whole["choices"][0]["text"] == reply and whole["choices"][0]["finish_reason"] == "stop"
    assert (
        cut["choices"][0]["text"] == "    return "
        and cut["choices"][0]["finish_reason"] == "length"
    )


def _prompt_of(r: RequestRecord) -> str:
    from specserve.bench.workloads import load_workload

    prompts = {p.id: p.text for p in load_workload(WorkloadConfig(suites=("structured",)))}
    return prompts[r.prompt_id]


def test_server_ignoring_stream_options_is_counted_from_text_and_flagged() -> None:
    with serve_in_thread(
        MockConfig(ttft_ms=2, itl_ms=1, output_tokens=9, ignore_stream_options=True)
    ) as server:
        result = run_benchmark(spec(f"http://127.0.0.1:{server.port}"))
    for r in ok_records(result):
        assert r.tokens_estimated and r.usage_completion_tokens is None and r.num_tokens == 9
    assert result.summary["*"].tokens_estimated == 6


def test_server_ignoring_stream_options_is_counted_with_the_given_tokenizer(smollm2) -> None:  # type: ignore[no-untyped-def]
    with serve_in_thread(
        MockConfig(ttft_ms=2, itl_ms=1, output_tokens=9, ignore_stream_options=True)
    ) as server:
        result = run_benchmark(
            spec(f"http://127.0.0.1:{server.port}", tokenizer="smollm2-135m-instruct")
        )
    for r in ok_records(result):
        expected = len(smollm2.tokenizer.encode(r.output_text, add_special_tokens=False))
        assert r.tokens_from_tokenizer and not r.tokens_estimated
        assert r.num_tokens == expected and sum(r.tokens_per_chunk) == expected
        assert r.chunk_tokens_estimated  # per-chunk counts are apportioned by text length
    assert result.summary["*"].tokens_from_tokenizer == 6
    assert result.summary["*"].tokens_estimated == 0


def test_no_usage_but_length_finish_gives_exact_n() -> None:
    with serve_in_thread(
        MockConfig(
            ttft_ms=2, itl_ms=1, output_tokens=64, tokens_per_chunk=2, ignore_stream_options=True
        )
    ) as server:
        result = run_benchmark(
            spec(f"http://127.0.0.1:{server.port}", sampling=SamplingConfig(max_tokens=10))
        )
    for r in ok_records(result):
        assert r.finish_reason == "length" and r.num_tokens == 10 and not r.tokens_estimated
        assert r.chunk_tokens_estimated and r.tokens_per_chunk == [2] * 5


def test_final_usage_only_apportions_chunks() -> None:
    cfg = MockConfig(
        ttft_ms=2, itl_ms=1, tokens_per_chunk=3, output_tokens=9, continuous_usage=False
    )
    with serve_in_thread(cfg) as server:
        result = run_benchmark(spec(f"http://127.0.0.1:{server.port}"))
    for r in ok_records(result):
        assert r.chunk_tokens_estimated and not r.tokens_estimated
        assert r.num_tokens == 9 and sum(r.tokens_per_chunk) == 9 and len(r.tokens_per_chunk) == 3


@pytest.mark.parametrize(
    ("knobs", "error"),
    [
        ({"fail_after_tokens": 3}, "error event mid-stream"),
        ({"abort_after_tokens": 2}, ""),
        ({"error_rate": 1.0}, "HTTP 500"),
    ],
)
def test_errors_are_recorded_and_counted(knobs: dict, error: str) -> None:
    with serve_in_thread(MockConfig(ttft_ms=2, itl_ms=1, output_tokens=8, **knobs)) as server:
        result = run_benchmark(spec(f"http://127.0.0.1:{server.port}"))
    recs = result.measured()
    assert len(recs) == 6 and all(r.error and error in r.error for r in recs)
    s = result.summary["*"]
    assert s.num_errors == 6 and s.error_rate == 1.0 and s.ttft_s.count == 0
    if "error_rate" in knobs:
        assert all(r.status == 500 for r in recs)


def test_extra_body_is_sent() -> None:
    with serve_in_thread(MockConfig(ttft_ms=1, itl_ms=1, output_tokens=20)) as server:
        result = run_benchmark(
            spec(f"http://127.0.0.1:{server.port}", num_requests=2, extra_body={"max_tokens": 3})
        )
    assert all(r.num_tokens == 3 and r.max_tokens == 3 for r in result.measured())


def test_partial_error_rate_is_seeded() -> None:
    with serve_in_thread(
        MockConfig(ttft_ms=1, itl_ms=1, output_tokens=4, error_rate=0.5, seed=1)
    ) as server:
        result = run_benchmark(spec(f"http://127.0.0.1:{server.port}", num_requests=40))
    s = result.summary["*"]
    assert 8 <= s.num_errors <= 32 and s.ttft_s.count == 40 - s.num_errors


def test_stalled_stream_times_out() -> None:
    with serve_in_thread(
        MockConfig(ttft_ms=1, itl_ms=1, output_tokens=8, stall_after_tokens=2)
    ) as server:
        result = run_benchmark(
            spec(f"http://127.0.0.1:{server.port}", num_requests=2, timeout_s=0.5)
        )
    assert all(r.error and r.error.startswith("timeout") for r in result.measured())
    assert all(r.tokens_per_chunk == [1, 1] for r in result.measured())


@pytest.mark.parametrize("total_suffix", [True, False])
def test_acceptance_from_metrics(total_suffix: bool) -> None:
    cfg = MockConfig(
        ttft_ms=1,
        itl_ms=1,
        tokens_per_chunk=3,
        output_tokens=12,
        spec_k=4,
        total_suffix=total_suffix,
    )
    with serve_in_thread(cfg) as server:
        result = run_benchmark(spec(f"http://127.0.0.1:{server.port}", warmup_requests=2))
    acc = result.acceptance
    # measured only: 6 requests × 4 steps, each drafting 4 and accepting 2 (+ bonus)
    assert acc.available and acc.num_drafts == 24 and acc.num_draft_tokens == 96
    assert acc.acceptance_rate == pytest.approx(0.5)
    assert acc.mean_acceptance_length == pytest.approx(3.0)
    assert acc.per_position == pytest.approx([1.0, 1.0, 0.0, 0.0])
    assert result.summary["*"].tokens_per_chunk.p50 == 3


def test_warmup_excluded_and_manifest() -> None:
    with serve_in_thread(MockConfig(ttft_ms=1, itl_ms=1, output_tokens=4)) as server:
        result = run_benchmark(
            spec(
                f"http://127.0.0.1:{server.port}",
                warmup_requests=3,
                metrics_url=f"http://127.0.0.1:{server.port}/nope",
            )
        )
    assert sum(r.warmup for r in result.records) == 3
    assert result.summary["*"].num_requests == 6
    m = result.manifest
    assert m.server_models is not None and m.server_models["data"][0]["id"] == "mock-model"
    assert m.num_prompts == 28 and len(m.prompt_set_hash) == 64
    assert m.spec["sampling"]["temperature"] == 0.0 and m.machine["cpu_count"]
    assert not result.acceptance.available and "404" in result.acceptance.note
    assert result.load_check.achieved is not None and not result.load_check.flagged


def test_open_loop_constant_rate_and_duration_bound() -> None:
    with serve_in_thread(MockConfig(ttft_ms=5, itl_ms=1, output_tokens=4)) as server:
        url = f"http://127.0.0.1:{server.port}"
        result = run_benchmark(
            spec(
                url,
                load=OpenLoop(rate_rps=10, arrival="constant"),
                num_requests=None,
                duration_s=1.0,
            )
        )
    recs = result.measured()
    assert len(recs) == 10 and all(r.ok for r in recs)
    assert result.load_check.kind == "rate" and result.load_check.reference == pytest.approx(10)
    sched = sorted(r.scheduled_ns for r in recs)
    assert (sched[-1] - sched[0]) / 1e9 == pytest.approx(0.9)
    # the achieved rate is the sends' own (how close they keep to the schedule depends on how
    # busy the machine is: no bound on it here)
    sends = sorted(r.send_ns for r in recs)
    assert all(r.send_ns >= r.scheduled_ns for r in recs)
    assert result.load_check.achieved == pytest.approx(9 / ((sends[-1] - sends[0]) / 1e9))


def test_open_loop_queueing_under_cap() -> None:
    with serve_in_thread(MockConfig(ttft_ms=100, itl_ms=1, output_tokens=2)) as server:
        load = OpenLoop(rate_rps=50, arrival="constant", max_concurrency=1)
        result = run_benchmark(spec(f"http://127.0.0.1:{server.port}", load=load))
    # 6 requests of ≥100 ms, one at a time, arriving every 20 ms: the last waits ≥ 400 ms
    assert max(r.queue_s for r in result.measured()) >= 0.4


def test_ab_alternates_arms_in_abba_batches() -> None:
    with (
        serve_in_thread(MockConfig(ttft_ms=2, itl_ms=1, output_tokens=4)) as a,
        serve_in_thread(MockConfig(ttft_ms=2, itl_ms=1, output_tokens=4, tokens_per_chunk=2)) as b,
    ):
        specs = [
            spec(f"http://127.0.0.1:{a.port}", label="baseline", num_requests=8),
            spec(f"http://127.0.0.1:{b.port}", label="candidate", num_requests=8),
        ]
        base, cand = run_ab(specs, batch_size=2)
    spans = []
    for res in (base, cand):
        for batch in sorted({r.batch for r in res.measured()}):
            recs = [r for r in res.measured() if r.batch == batch]
            spans.append(
                (min(r.send_ns for r in recs), max(r.done_ns or 0 for r in recs), res.label, batch)
            )
    spans.sort()
    assert [(s[2], s[3]) for s in spans] == [
        ("baseline", 0),
        ("candidate", 0),
        ("candidate", 1),
        ("baseline", 1),
        ("baseline", 2),
        ("candidate", 2),
        ("candidate", 3),
        ("baseline", 3),
    ]
    assert all(x[1] <= y[0] for x, y in itertools.pairwise(spans))  # never overlap
    assert [r.prompt_id for r in base.measured()] == [r.prompt_id for r in cand.measured()]
    with pytest.raises(ValueError, match="differ in sampling"):
        run_ab(
            [specs[0], specs[1].model_copy(update={"sampling": SamplingConfig(max_tokens=3)})], 2
        )


def test_sweep() -> None:
    with serve_in_thread(MockConfig(ttft_ms=2, itl_ms=1, output_tokens=4)) as server:
        results = run_sweep(spec(f"http://127.0.0.1:{server.port}"), [1, 3])
    assert [r.concurrency for r in results] == [1, 3] and [r.load_name for r in results] == [
        "c1",
        "c3",
    ]
