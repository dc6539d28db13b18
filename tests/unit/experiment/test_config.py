"""Experiment config: defaults are the embedded study; bad configs fail with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve.experiment.config import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    ExperimentConfigError,
    load_config,
)


def test_no_file_gives_embedded_default() -> None:
    cfg = load_config(None)
    assert cfg.servers is not None and cfg.endpoints is None
    assert cfg.servers.target == DEFAULT_TARGET
    assert cfg.servers.draft == DEFAULT_DRAFT
    assert cfg.benchmark.temperature == 0.0
    assert set(cfg.benchmark.suites) == {"structured", "open-ended"}


def test_arms_differ_only_in_speculation() -> None:
    from specserve.experiment.config import ServersConfig

    servers = load_config(None).servers
    assert servers is not None
    base, spec = servers.serve_args(speculative=False), servers.serve_args(speculative=True)
    assert base[: base.index("--spec-method")] == spec[: spec.index("--spec-method")]
    assert base[base.index("--spec-method") + 1] == "none"
    assert spec[spec.index("--draft-model") + 1] == DEFAULT_DRAFT
    assert spec[spec.index("--draft-weights") + 1] == "int4"  # the cheap draft is the default
    assert "--draft-weights" not in base
    # both arms run the dtype's own bf16 weights, named so that serve does not pick gguf
    assert base[base.index("--weights") + 1] == spec[spec.index("--weights") + 1] == "bf16"
    fp32 = ServersConfig(dtype="float32").serve_args(speculative=False)
    assert fp32[fp32.index("--weights") + 1] == "fp32"
    gguf = ServersConfig(weights="gguf").serve_args(speculative=False)
    assert gguf[gguf.index("--weights") + 1] == "gguf"


def test_draft_weights_follow_the_method() -> None:
    from specserve.experiment.config import ServersConfig

    assert ServersConfig(method="ngram").draft_weights is None
    assert "--draft-weights" not in ServersConfig(method="ngram").serve_args(speculative=True)
    same = ServersConfig(method="draft", draft_weights=None).serve_args(speculative=True)
    assert "--draft-weights" not in same
    with pytest.raises(ValueError, match="draft_weights is only used with methods"):
        ServersConfig(method="suffix", draft_weights="int4")


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


def test_endpoints_config_starts_nothing(tmp_path: Path) -> None:
    cfg = load_config(
        _write(
            tmp_path,
            """
name: aws-study
endpoints:
  baseline: {base_url: "http://vllm-baseline:8000", model: Qwen/Qwen3-32B}
  speculative: {base_url: "http://vllm-speculative:8000", model: Qwen/Qwen3-32B}
benchmark: {concurrency: [4], max_tokens: 600}
""",
        )
    )
    assert cfg.servers is None
    assert cfg.endpoints is not None
    assert cfg.benchmark.concurrency == (4,)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("servers: {num_speculative_tokens: 0}", "num_speculative_tokens"),
        ("servers: {num_speculative_tokens: 99}", "num_speculative_tokens"),
        ("servers: {method: ngram, draft: some-model}", "only used with methods 'draft'"),
        ("servers: {method: eagle}", "method"),
        ("benchmark: {concurrency: [0]}", "concurrency"),
        ("benchmark: {num_requests: 0}", "num_requests"),
        ("bogus_key: 1", "bogus_key"),
        ("servers: {host: 10.0.0.5}", "loopback"),
        ("servers: {baseline_port: 9000, speculative_port: 9000}", "must differ"),
        (
            "servers: {}\nendpoints: {baseline: {base_url: 'http://a', model: m},"
            " speculative: {base_url: 'http://b', model: m}}",
            "not both",
        ),
        ("benchmark: {rates: [0]}", "rates must be in (0, 100000]"),
        ("benchmark: {rates: [1, 1]}", "must not repeat"),
        ("benchmark: {concurrency: [], rates: []}", "at least one load point"),
        ("cost: {instance: m7.huge}", "unknown instance 'm7.huge'; known: local, trn2.48xlarge"),
        ("cost: {price_per_hour: -2}", "price per hour must be >= 0"),
        ("cost: {instance: local, price_per_hour: 1}", "not both"),
        ("cost: {}", "give instance or price_per_hour"),
        ("cost: {instance: local, watts: 90}", "both watts and price per kWh"),
        (
            "servers: {disable_by_batch_size: 2}\nquality: {concurrency: 2}",
            "quality.concurrency (2) must be below servers.disable_by_batch_size (2)",
        ),
        ("- just\n- a list", "expected a mapping"),
        ("servers: [unclosed", "YAML"),
    ],
)
def test_invalid_configs_name_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ExperimentConfigError) as e:
        load_config(_write(tmp_path, text))
    assert needle in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ExperimentConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")


def test_shipped_aws_study_example_validates() -> None:
    root = Path(__file__).resolve().parents[3]
    cfg = load_config(root / "examples" / "aws-trainium-study.yaml")
    assert cfg.endpoints is not None and cfg.servers is None
    assert cfg.benchmark.concurrency == (4,)
    assert cfg.benchmark.max_tokens == 600
    assert cfg.benchmark.llmperf.mean_input_tokens == 64


def test_load_points_concurrency_then_rates(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "benchmark: {concurrency: [4, 1], rates: [2, 0.5]}"))
    points = cfg.benchmark.load_points()
    assert [name for name, _ in points] == ["c1", "c4", "r0.5", "r2"]
    assert points[2][1].kind == "rate" and points[2][1].rate_rps == 0.5
    assert [n for n, _ in load_config(None).benchmark.load_points()] == ["c1"]
    rates_only = load_config(_write(tmp_path, "benchmark: {rates: [1.5]}"))
    assert [n for n, _ in rates_only.benchmark.load_points()] == ["r1.5"]


def test_cost_block_and_its_defaults(tmp_path: Path) -> None:
    default = load_config(None).pricing()  # our servers run here: local, 0 per hour
    assert default is not None and default.instance == "local" and default.hourly_usd == 0
    priced = load_config(_write(tmp_path, "cost: {instance: inf2.48xlarge}")).pricing()
    assert priced is not None and priced.price_per_hour == pytest.approx(12.98127)
    given = load_config(_write(tmp_path, "cost: {price_per_hour: 4.5}")).pricing()
    assert given is not None and given.hourly_usd == 4.5
    endpoints = _write(
        tmp_path,
        "endpoints: {baseline: {base_url: 'http://a', model: m},"
        " speculative: {base_url: 'http://b', model: m}}",
    )
    assert load_config(endpoints).pricing() is None  # remote services: no price assumed
