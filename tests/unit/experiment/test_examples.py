"""The experiment configs shipped in ``examples/`` validate (``specserve experiment FILE``)."""

from __future__ import annotations

from pathlib import Path

from specserve.experiment.config import load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_serving_ab_example_is_the_serving_benchmark() -> None:
    # docs/benchmarks.md, "serving": the bf16 target alone vs with the int4 0.5B draft,
    # adaptive k, no drafting from 3 requests per step, concurrency 1-8, both suites.
    cfg = load_config(EXAMPLES / "serving-ab.yaml")
    assert cfg.name == "serving-ab" and cfg.endpoints is None and cfg.servers is not None
    s = cfg.servers
    assert (s.target, s.draft, s.method) == (
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "draft",
    )
    assert (s.dtype, s.draft_weights, s.num_speculative_tokens) == ("bfloat16", "int4", "auto")
    assert (s.disable_by_batch_size, s.max_model_len, s.max_num_seqs) == (3, 1024, 8)
    b = cfg.benchmark
    assert b.suites == ("structured", "open-ended") and b.concurrency == (1, 2, 4, 8)
    assert (b.endpoint, b.temperature, b.num_requests, b.max_tokens) == ("chat", 0.0, 8, 32)
    baseline = s.serve_args(speculative=False)
    assert "--draft-model" not in baseline and baseline[-2:] == ["--spec-method", "none"]
